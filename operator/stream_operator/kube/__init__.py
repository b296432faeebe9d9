"""How the operator talks to the cluster: its Kubernetes API client (timeouts, writes
refused once it may not act), idempotent apply, Events, the leader election on its
Lease, and its two HTTP calls to the servers' pods (``archive_call``,
``switchover_call``).

The only folder besides the controllers that does I/O; the API types, renderers and
decisions below it never import it (a contract).
"""
