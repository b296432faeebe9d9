"""The Lease and what a replica believes about it: the Kubernetes Lease, every write this
replica makes to it, the role loop and its state, the credentials and clock they use, and
the pod labels the holder sets (docs/replication.md, "Roles").
"""
