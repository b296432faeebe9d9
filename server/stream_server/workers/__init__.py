"""``--workers N``: a writer process and N worker processes behind one port (docs/workers.md).

``processes`` runs the two kinds of process; ``supervisor`` starts, replaces and stops
the workers; ``link`` is the batched message channel between them, ``host`` the
writer's end (the store's work) and ``linked_store`` / ``linked_limits`` a worker's;
``local_reads`` serves a worker's catch-up reads from the data directory itself;
``worker_app`` is what a worker serves, ``proxy`` what it relays to the writer.
"""
