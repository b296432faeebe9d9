"""The kubelet stand-in's projected volumes (testkit/pod_projected.py), as the operator's
pods mount them: the pod's annotations and name (downward API) and the operator's fenced
list (its ConfigMap, optional) in one directory, the one the server's fence file is in."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_operator.decisions.lifecycle import POD_FENCED
from stream_operator.specs import render
from stream_operator.specs.render import render_fence_configmap, render_statefulset
from stream_server import fencing
from testkit.cluster import Cluster, cluster
from testkit.pod_objects import refresh_downward
from testkit.pod_projected import projected_volumes

pytestmark = pytest.mark.processes  # the emulated API server

NS = "default"


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


def fence_list(names: list[str]) -> dict:
    """The operator's ConfigMap, without its owner (no DurableStream here: the emulator's
    garbage collection would take it)."""
    body = render_fence_configmap("ev", NS, "uid", names)
    assert body["metadata"]["ownerReferences"][0]["name"] == "ev"
    del body["metadata"]["ownerReferences"]
    return body


def test_the_operators_names_are_the_servers():
    assert render.FENCE_LIST_KEY == fencing.LIST_FILE
    assert render.POD_NAME_FILE == fencing.NAME_FILE
    assert render.FENCE_ENV["value"] == f"{render.PODINFO_DIR}/annotations"


def test_a_projected_volume_holds_the_pod_and_the_configmap_at_its_start(
    kube: Cluster, tmp_path: Path
):
    template = render_statefulset("ev", NS, "uid", {})["spec"]["template"]
    meta = {"name": "ev-1", "annotations": {"a": "1"}}
    # No ConfigMap yet: optional, so the pod starts and the list's file is not there.
    made = projected_volumes(kube, NS, template, meta, tmp_path / "a")
    assert made is not None
    mounts, files = made
    podinfo = mounts[render.PODINFO_DIR]
    assert sorted(p.name for p in podinfo.iterdir()) == ["annotations", "pod-name"]
    assert (podinfo / "pod-name").read_text() == "ev-1"
    assert fencing.read_fence(str(podinfo / "annotations")) is False

    kube.create(fence_list(["ev-1"])).raise_for_status()
    mounts, files = projected_volumes(kube, NS, template, meta, tmp_path / "b") or ({}, [])
    podinfo = mounts[render.PODINFO_DIR]
    assert (podinfo / fencing.LIST_FILE).read_text() == '["ev-1"]'
    assert fencing.read_fence(str(podinfo / "annotations")) is True  # fenced from its start
    # The downward API files follow the pod, as a downwardAPI volume's do.
    assert refresh_downward(files, {**meta, "annotations": {POD_FENCED: "false"}})
    assert fencing.read_fence(str(podinfo / "annotations")) is False


def test_a_missing_configmap_that_is_not_optional_keeps_the_pod_waiting(
    kube: Cluster, tmp_path: Path
):
    template = copy.deepcopy(render_statefulset("ev", NS, "uid", {})["spec"]["template"])
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "podinfo")
    volume["projected"]["sources"][1]["configMap"]["optional"] = False
    assert projected_volumes(kube, NS, template, {"name": "ev-0"}, tmp_path) is None
    kube.create(fence_list([])).raise_for_status()
    assert projected_volumes(kube, NS, template, {"name": "ev-0"}, tmp_path) is not None
