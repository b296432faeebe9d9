"""spec.template and spec.server.settings through the real operator and an emulated API
server (testkit.kube): the ServiceAccount a single server gets for IRSA, its annotations
followed and the account pruned when the template goes; a refused setting said in the
status and nothing applied."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stream_operator import KIND
from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import durable_stream
from testkit.operator_rbac import operated_cluster
from testkit.pod_objects import pod_object, statefulset_status

pytestmark = pytest.mark.processes

NS = "default"
ROLE = "eks.amazonaws.com/role-arn"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with operated_cluster() as c:
        yield c


def _template(arn: str) -> dict:
    return {"serviceAccount": {"metadata": {"annotations": {ROLE: arn}}}}


def test_a_single_servers_account_follows_the_template_and_goes_with_it(kube: Cluster):
    first = "arn:aws:iam::111122223333:role/one"
    kube.create(durable_stream("events", {"template": _template(first)})).raise_for_status()
    account = wait_for(
        lambda: kube.get("ServiceAccount", NS, "events"), message="the pods' ServiceAccount"
    )
    assert account["metadata"]["annotations"][ROLE] == first
    sts = wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "events"
    second = "arn:aws:iam::111122223333:role/two"
    kube.patch(KIND, NS, "events", {"spec": {"template": _template(second)}})
    wait_for(
        lambda: kube.get("ServiceAccount", NS, "events")["metadata"]["annotations"][ROLE] == second,
        message="the new role on the account",
    )
    kube.patch(KIND, NS, "events", {"spec": {"template": None}})
    wait_for(
        lambda: kube.get("ServiceAccount", NS, "events") is None,
        message="the account pruned with the template",
    )
    pod = kube.get("StatefulSet", NS, "events")["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod


def test_a_refused_setting_is_said_and_nothing_is_applied(kube: Cluster):
    kube.create(durable_stream("events", {"server": {"settings": {"max-streams": 10}}}))
    cm = wait_for(lambda: kube.get("ConfigMap", NS, "events-config"), message="ConfigMap")
    assert cm["data"]["DS_MAX_STREAMS"] == "10"
    # The CRD's rule refuses an owned name at the API; a value out of range only the
    # operator can check against the server's declaration.
    kube.patch(KIND, NS, "events", {"spec": {"server": {"settings": {"max-streams": -5}}}})

    def accepted() -> dict:
        obj = kube.get(KIND, NS, "events") or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Accepted"), {})

    cond = wait_for(lambda: accepted().get("status") == "False" and accepted(), message="refused")
    assert cond["reason"] == "ChangeRefused"
    assert "server.settings.max-streams must be 0 to" in cond["message"]
    assert kube.get("ConfigMap", NS, "events-config")["data"]["DS_MAX_STREAMS"] == "10"


def test_a_pod_no_node_takes_is_named_with_the_schedulers_words(kube: Cluster):
    """Issue 42: a Pending pod read as ReplicasNotReady; through the status round it is
    named with the PodScheduled condition kube-scheduler writes."""
    kube.create(durable_stream("events", {"replicas": 1})).raise_for_status()
    sts = wait_for(lambda: kube.get("StatefulSet", NS, "events"), message="StatefulSet")
    kube.create(pod_object(sts, 0)).raise_for_status()
    said = "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available."
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": said,
        "lastProbeTime": None,
        "lastTransitionTime": "2026-11-29T14:00:00Z",
    }
    pending = {"phase": "Pending", "qosClass": "Burstable", "conditions": [scheduled]}
    kube.patch("Pod", NS, "events-0", {"status": pending}, status=True).raise_for_status()
    status = statefulset_status(sts, 1, 0, 1, "events-1", "events-1")
    kube.patch("StatefulSet", NS, "events", {"status": status}, status=True).raise_for_status()

    def ready() -> dict:
        conds = ((kube.get(KIND, NS, "events") or {}).get("status") or {}).get("conditions")
        return next((c for c in conds or [] if c["type"] == "Ready"), {})

    cond = wait_for(lambda: ready().get("reason") == "Unschedulable" and ready(), message="named")
    assert cond["message"].startswith(f"pod events-0 is not scheduled: {said}")
