"""A Durable Streams protocol server: durable, append-only, resumable byte streams over HTTP."""

__version__ = "0.1.0"
