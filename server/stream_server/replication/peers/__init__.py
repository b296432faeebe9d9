"""What the replicas say to each other: the wire format, the HTTP upgrade to a stream,
TLS to a peer and the shared token that lets a peer in.
"""
