"""The kopf operator for durable-streams-py: DurableStream resources -> StatefulSets of servers.

Handlers are thin (handlers.py); what a spec becomes is decided by pure
functions (spec.py, render.py, plan.py, status.py) that tests run without a cluster.
"""

GROUP = "streams.pyds.dev"
VERSION = "v1alpha1"
PLURAL = "durablestreams"
KIND = "DurableStream"
