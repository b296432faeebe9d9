"""The kubelet stand-in's volumes behave as claims and dynamically provisioned volumes do.

A StatefulSet's claim outlives its pod (a scale-down and back up, a restart finds the same
data), and a claim deleted through the API and made again by the StatefulSet controller is
bound to a new, empty volume: the old PersistentVolume went with its claim. The operator's
scale-down to one replica relies on the second (it deletes the removed pods' claims so that
they come back empty and copy from the primary); if these fail, the scaling tests built on
``testkit.kubelet`` prove less than they claim.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_operator.specs.render import desired_objects
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kubelet import Kubelet
from testkit.pod_objects import volume_dir

pytestmark = pytest.mark.processes

NS = "default"
NAME = "vols"
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture
def kube() -> Iterator[Cluster]:
    with cluster() as c:  # with a default StorageClass
        yield c


def claim(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}}


def test_a_claim_made_again_gets_a_new_empty_directory(tmp_path: Path) -> None:
    first = volume_dir(tmp_path, claim("data-x-1", "uid-1"))
    (first / "held").write_text("acknowledged")
    assert volume_dir(tmp_path, claim("data-x-1", "uid-1")) == first
    assert (first / "held").read_text() == "acknowledged"  # the same claim: the same volume

    second = volume_dir(tmp_path, claim("data-x-1", "uid-2"))
    assert second == first and list(second.iterdir()) == []  # a new claim: empty
    assert (tmp_path / "released" / "data-x-1-uid-1" / "held").read_text() == "acknowledged"


def test_a_directory_filled_before_its_claim_is_the_claims(tmp_path: Path) -> None:
    """A test that puts data on a volume before the pod starts (say, a newer format) finds
    it there: a directory with no record is adopted by the first claim that binds it."""
    (tmp_path / "data-x-0").mkdir()
    (tmp_path / "data-x-0" / "FORMAT").write_text("from the test")
    assert (volume_dir(tmp_path, claim("data-x-0", "u")) / "FORMAT").read_text() == "from the test"


def _served(kubelet: Kubelet) -> str | None:
    pods = kubelet.ready_pods()
    return pods[0].url if len(pods) == 1 else None


def _scale(kube: Cluster, replicas: int) -> None:
    body = {"spec": {"replicas": replicas}}
    kube.patch("StatefulSet", NS, NAME, body).raise_for_status()


def test_a_deleted_claim_comes_back_empty_and_a_kept_one_keeps_its_data(
    kube: Cluster, tmp_path: Path
) -> None:
    for obj in desired_objects(NAME, NS, "uid-0", {"replicas": 1}):
        if obj["kind"] in ("ConfigMap", "StatefulSet"):
            # No DurableStream owns them here: the garbage collector would take them.
            obj["metadata"].pop("ownerReferences", None)
            kube.create(obj).raise_for_status()
    with Kubelet(kube, NS, NAME, tmp_path, restart_delay=0.2) as kubelet:
        url = wait_for(lambda: _served(kubelet), timeout=30, message="pod 0 ready")
        httpx.put(f"{url}/v1/stream/kept", headers=OCTET).raise_for_status()
        httpx.post(f"{url}/v1/stream/kept", content=b"held", headers=OCTET).raise_for_status()
        pvc = kube.get("PersistentVolumeClaim", NS, f"data-{NAME}-0")

        # Scaled to zero and back: the claim stays, and so does the data.
        _scale(kube, 0)
        wait_for(lambda: not kubelet.pods, timeout=30, message="pod 0 gone")
        _scale(kube, 1)
        url = wait_for(lambda: _served(kubelet), timeout=30, message="pod 0 back")
        assert httpx.get(f"{url}/v1/stream/kept", params={"offset": "-1"}).content == b"held"

        # Scaled to zero, the claim deleted through the API, scaled back: a new claim, a
        # new volume, nothing on it.
        _scale(kube, 0)
        wait_for(lambda: not kubelet.pods, timeout=30, message="pod 0 gone again")
        kube.delete("PersistentVolumeClaim", NS, f"data-{NAME}-0").raise_for_status()
        _scale(kube, 1)
        url = wait_for(lambda: _served(kubelet), timeout=30, message="pod 0 on a new claim")
        again = kube.get("PersistentVolumeClaim", NS, f"data-{NAME}-0")
        assert again["metadata"]["uid"] != pvc["metadata"]["uid"]
        assert httpx.get(f"{url}/v1/stream/kept", params={"offset": "-1"}).status_code == 404
        released = tmp_path / "released" / f"data-{NAME}-0-{pvc['metadata']['uid']}"
        assert released.is_dir()  # the old volume, never used again
