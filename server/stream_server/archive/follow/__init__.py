"""A replica cluster's server, following another cluster's archive read-only: its first
start from the newest backup, and which archived frames it takes next
(docs/replica-clusters.md).
"""
