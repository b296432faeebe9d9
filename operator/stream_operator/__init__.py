"""The kopf operator for durable-streams-py: DurableStream resources -> StatefulSets of servers.

Handlers are thin (handlers.py, over the glue of reconcile.py and status_round.py);
what a spec becomes is decided by pure functions (spec.py parses it once into typed
views; render.py, plan.py, rollout.py, status.py) that tests run without a cluster.
"""

GROUP = "streams.pyds.dev"
VERSION = "v1alpha1"
PLURAL = "durablestreams"
KIND = "DurableStream"
