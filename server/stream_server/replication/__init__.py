"""Replica sets: one primary elected by a Kubernetes Lease, standbys that follow it.

See docs/replication.md for the design and the safety argument. Nothing here
runs in single-node mode (no ``--replication-lease``).
"""
