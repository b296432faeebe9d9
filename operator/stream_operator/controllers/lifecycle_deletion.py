"""The end of a DurableStream whose claims go with it (``pvcRetention: Delete``): the
pods first, then the Lease, then the claims, in that order.

Only such an object carries the operator's finalizer (``handlers.cleanup``); while it
does, the garbage collector deletes none of its dependents. Left to the collector once
the finalizer is gone, the Lease (a dependent since ``lease_owner``) went at the same
time as the StatefulSet, while its pods were still terminating: a server that was
still running renewed it, found it gone and created it again, without any owner (it
had no Lease to copy the reference from). That Lease outlived the DurableStream, and a
DurableStream made again under the same name, on new empty volumes, found a Lease
naming the old set's id and terms, which its servers do not hold.

So the StatefulSet is deleted here, and the finalizer stays until no pod of the set is
left; only then can no server write the Lease again, and the Lease and the claims are
deleted. A DurableStream kept with ``Retain`` keeps its claims, whose data names the
Lease's set id: a Lease a terminating server wrote again fits the volumes a later
same-name DurableStream finds, and its round adopts it (``lease_owner``).
"""

from __future__ import annotations

from kubernetes import client

from stream_operator.kube.apply import delete, delete_pvcs, instance_pods
from stream_operator.specs.render import lease_name


def finish(ac: client.ApiClient, namespace: str, name: str) -> tuple[str, list[str]]:
    """One step of the deletion: what it still waits for ("" once done) and the claims
    deleted. Each step is idempotent: the handler calls it again until it is done."""
    delete(ac, "StatefulSet", namespace, name)
    left = sorted(p["metadata"]["name"] for p in instance_pods(ac, namespace, name))
    if left:
        return f"waiting for the pods to end ({', '.join(left)}) before the Lease goes", []
    delete(ac, "Lease", namespace, lease_name(name))
    return "", delete_pvcs(ac, namespace, name)
