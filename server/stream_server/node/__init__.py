"""A node is one ``Topology`` and a list of ``Part``s.

The topology says what this server is in its cluster (a single node, a replica
set's member, a replica cluster's follower of another cluster's archive): it
builds the store on the engine hooks and ack gate that role needs, holds the
read and write gates, and starts or pauses the work only a primary may do. Each
service beside the streams (subscriptions, the archive, base backups, metrics,
the replication endpoints) is a ``Part``: its routes, metrics collector, store
events, write refusal, start and stop, in one object. ``app.py`` assembles them
and knows no mode; a worker process assembles the ones that apply to it. A new
mode or service is one new class, not an edit in every place that wires them.
"""
