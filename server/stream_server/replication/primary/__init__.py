"""The primary's side of log shipping: the frames it holds, the stream it pushes to each
standby, the in-sync set and the ack gate (docs/replication.md, "Log shipping").
"""
