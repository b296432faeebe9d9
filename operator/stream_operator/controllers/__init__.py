"""The operator's controllers: kopf's events turned into work, and the work carried out
(CloudNativePG's ``internal/controller``).

``handlers`` is the thin kopf glue; ``reconcile`` makes the cluster what the spec asks
for and ``status_round`` writes what is true now, each under the object's lock
(``object_locks``) and on the periodic pool (``periodic``). The ``*_actions`` modules,
``replica_set``, ``backups``, ``archive_status``, ``builtin_tls``, ``token_rotation``
and the rest read what a decision needs, call the pure decisions and renderers, and
apply the answer through ``kube``. Nothing below imports this folder (a contract).
"""
