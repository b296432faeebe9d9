"""What the operator must do, decided from what it read: pure functions over the parsed
spec and the objects as the API returns them.

Drift and growth (``plan``), the status and its conditions (``status``, from the pods'
states in ``pod_states``), a replica set's roles from its Lease (``replica_roles``),
the rolling update (``rollout``), scaling (``scaling``), the lifecycle annotations
(``lifecycle``), promotion and demotion (``replica_cluster``), the server image
(``server_image``), the standby Spark jobs read (``analytics_source``). The
controllers read, call these, and carry the answer out; tests check each decision
without a cluster.
"""
