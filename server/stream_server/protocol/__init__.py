"""The HTTP face of the protocol: parsing and validation, one handler per operation,
SSE encoding, and the mapping of refusals to status codes.
"""
