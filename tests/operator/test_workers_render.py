"""The server's worker count (``spec.server.workers``, DS_WORKERS) as the operator renders it.

Left out, the pod's CPU limit decides (the downward API, so the count follows the limit
when the resources change); without a CPU limit, one process; set, that number. The CRD
and the operator both refuse a negative one. docs/kubernetes.md, "Sizing a pod".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from stream_operator.api.spec import refused_change, with_defaults
from stream_operator.specs.render import (
    CONFIG_HASH,
    config_hash,
    render_configmap,
    render_statefulset,
    server_env,
)
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.pod_objects import container_env

UID = "uid"
LIMITED = {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2500m", "memory": "2Gi"}}}
FROM_THE_LIMIT = {
    "name": "DS_WORKERS",
    "valueFrom": {
        "resourceFieldRef": {"containerName": "server", "resource": "limits.cpu", "divisor": "1"}
    },
}


def server_container(spec: dict[str, Any]) -> dict[str, Any]:
    sts = render_statefulset("ev", "ns", UID, spec)
    (container,) = [
        c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "server"
    ]
    return container


def workers_vars(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in server_container(spec)["env"] if v["name"] == "DS_WORKERS"]


def pod_template_hash(spec: dict[str, Any]) -> str:
    sts = render_statefulset("ev", "ns", UID, spec)
    return str(sts["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH])


def test_left_out_with_a_cpu_limit_the_limit_rounded_up_decides():
    assert workers_vars(LIMITED) == [FROM_THE_LIMIT]
    # Not in the ConfigMap as well: the container's variable would win over it anyway.
    assert "DS_WORKERS" not in render_configmap("ev", "ns", UID, LIMITED)["data"]
    # The limit is the container's own (the downward API reads that container's).
    assert server_container(LIMITED)["resources"]["limits"]["cpu"] == "2500m"


def test_left_out_without_a_cpu_limit_one_process():
    """The downward API would give the node's allocatable CPUs, which a pod without a limit
    shares with the rest of the node: one process instead, whatever the server's default."""
    for spec in ({}, {"resources": {"requests": {"cpu": "4"}, "limits": {"memory": "1Gi"}}}):
        assert workers_vars(spec) == []
        assert render_configmap("ev", "ns", UID, spec)["data"]["DS_WORKERS"] == "1"


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_set_it_is_that_number_with_or_without_a_limit(workers: int):
    for base in ({}, LIMITED):
        spec = {**base, "server": {"workers": workers}}
        assert with_defaults(spec).server.workers == workers
        assert workers_vars(spec) == []
        assert server_env(spec)["DS_WORKERS"] == str(workers)


def test_a_changed_worker_count_rolls_the_pods():
    """Set, the count is in the ConfigMap, which the pods read at start only: the config
    hash (over spec.server) rolls them. Left out with a limit, the count follows
    spec.resources, which the hash covers already."""
    hashes = {pod_template_hash({"server": {"workers": n}}) for n in (0, 1, 2)}
    assert len(hashes) == 3
    assert pod_template_hash({}) not in hashes  # left out -> set: a roll too
    wider = {"resources": {**LIMITED["resources"], "limits": {"cpu": "4", "memory": "2Gi"}}}
    assert pod_template_hash(wider) != pod_template_hash(LIMITED)
    assert workers_vars(wider) == workers_vars(LIMITED) == [FROM_THE_LIMIT]


def test_left_out_the_config_hash_is_what_it_was():
    """No default in the spec: an operator upgrade leaves the hash of every DurableStream
    that does not set the field (tests/operator/test_render.py pins three)."""
    assert "workers" not in with_defaults({}).raw["server"]
    assert config_hash({"server": {}}) == config_hash({})


def test_a_negative_count_is_refused_by_the_operator():
    """The CRD's minimum, for a cluster that did not run it: the server would not start."""
    refusal = refused_change(None, {"server": {"workers": -1}})
    assert refusal is not None and "server.workers" in refusal
    assert "server.workers" in (refused_change({}, {"server": {"workers": -2}}) or "")
    assert refused_change(None, {"server": {"workers": 0}}) is None


@pytest.fixture(scope="module")
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def test_the_crd_refuses_a_negative_count_and_defaults_none(kube: Cluster):
    r = kube.create(durable_stream("negative", {"server": {"workers": -1}}))
    assert r.status_code == 422 and "workers" in r.json()["message"]
    assert kube.get("DurableStream", "default", "negative") is None
    kube.create(durable_stream("auto", {"server": {"workers": 0}})).raise_for_status()
    kube.create(durable_stream("unset")).raise_for_status()
    # Left out, it stays out: the pod's CPU limit decides, not a default of the schema.
    unset = kube.get("DurableStream", "default", "unset")["spec"]
    assert "workers" not in (unset.get("server") or {})
    assert kube.get("DurableStream", "default", "auto")["spec"]["server"]["workers"] == 0


@pytest.mark.parametrize(
    ("limit", "workers"), [("2500m", "3"), ("2", "2"), (1, "1"), ("100m", "1")]
)
def test_the_kubelet_gives_the_limit_rounded_up(kube: Cluster, limit: Any, workers: str):
    """What the pods read (the kubelet stand-in, as Kubernetes rounds a CPU quantity up to
    the divisor): the server is given whole processes."""
    spec = {"resources": {"limits": {"cpu": limit}}}
    env = container_env(kube, "default", server_container(spec), "ev-0")
    assert env["DS_WORKERS"] == workers
    unlimited = container_env(kube, "default", server_container({}), "ev-0")
    assert "DS_WORKERS" not in unlimited  # the ConfigMap's "1" (not applied here)
