"""The kopf operator for durable-streams-py: DurableStream resources -> StatefulSets of servers.

Laid out by concern, as CloudNativePG lays out its operator, each folder importing only
those below it (pyproject's import contracts):

- ``controllers/``: the kopf handlers (thin), reconcile, the status round, and what
  carries each decision out;
- ``kube/``: the API client, apply, Events, leader election, the calls to the servers;
- ``decisions/``: what must change, the status, roles, the rolling update (pure);
- ``specs/``: what a spec becomes, the objects as plain dicts (pure);
- ``api/``: the spec parsed once into typed views, and its checks (pure);
- ``configuration/``: the operator's own settings;
- ``plugin/``: ``kubectl dstream``, which reads and annotates only.

The pure folders are run by tests without a cluster.
"""

GROUP = "streams.pyds.dev"
VERSION = "v1alpha1"
PLURAL = "durablestreams"
KIND = "DurableStream"
