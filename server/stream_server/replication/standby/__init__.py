"""A standby's side: the stream it receives, the writer that makes it durable, the stream
layer mirrored up to the commit point, its read freshness, and a snapshot's install.
"""
