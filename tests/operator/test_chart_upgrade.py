"""Issue 25: ``helm upgrade`` upgrades the CRD, with real helm against the emulated API
server: from the previous chart (its CRD in crds/, which helm installs once and never
upgrades) to this one (the CRD a template kept by ``helm.sh/resource-policy: keep``).

What helm needs of the API server and the emulator gives (testkit/kube.py): discovery,
CRDs that become Established and serve their new schema once updated, release records
(Secrets) in Kubernetes' protobuf encoding. The gaps: the emulator's OpenAPI document is
empty, so helm's client-side validation checks nothing (the API server still validates
every DurableStream against the CRD it serves, and tests/operator/test_chart.py checks
the rendered manifests with kubernetes-validate); kmock cannot create Namespaces, so no
``--create-namespace`` (the emulator needs no Namespace object).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit import crd_schema
from testkit.cluster import Cluster, cluster
from testkit.kube import CRD_FILE, durable_stream

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "durable-streams"
PREVIOUS = "df9c49b"  # the last chart with its CRD in crds/
CRD_NAME = "durablestreams.streams.pyds.dev"
NS = "ds"
sys.path.insert(0, str(ROOT / "scripts"))

from get_tools import ensure  # noqa: E402

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart as of ``PREVIOUS``, from git."""
    out = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS, "charts/durable-streams"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    chart = out / "charts" / "durable-streams"
    assert (chart / "crds" / "durablestreams.yaml").exists()
    return chart


class Helm:
    """Real helm with a kubeconfig for the emulated API server, and its own home."""

    def __init__(self, c: Cluster, home: Path) -> None:
        kubeconfig = home / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emu", "cluster": {"server": c.url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u"}}],
                    "current-context": "emu",
                }
            )
        )
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        self.binary = str(ensure() / "helm")

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.binary, *args, "--namespace", NS],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        if ok:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[Cluster, Helm]]:
    with cluster(crd=False) as c:
        yield c, Helm(c, tmp_path)


def crd(c: Cluster) -> dict[str, Any] | None:
    return c.get("CustomResourceDefinition", None, CRD_NAME)


def spec_schema(obj: dict[str, Any]) -> dict[str, Any]:
    version = obj["spec"]["versions"][0]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def identity(obj: dict[str, Any]) -> tuple[str, Any]:
    return obj["metadata"]["uid"], obj["spec"]


def test_helm_upgrade_from_the_chart_with_crds_dir_upgrades_the_crd_and_keeps_it(
    kube: tuple[Cluster, Helm], previous_chart: Path
):
    c, helm = kube
    helm("install", "ds", str(previous_chart), "--set", "example.enabled=true")
    old = crd(c)
    assert old is not None and "primaryUpdateStrategy" not in spec_schema(old)
    # A user's DurableStream next to the release's example.
    c.create(durable_stream("mine", {"replicas": 1}, namespace=NS)).raise_for_status()
    before = {n: identity(c.get("DurableStream", NS, n)) for n in ("events", "mine")}
    mine_version = c.get("DurableStream", NS, "mine")["metadata"]["resourceVersion"]
    # The old CRD has no owner in helm's eyes: helm refuses to adopt it, as documented...
    refused = helm("upgrade", "ds", str(CHART), "--set", "example.enabled=true", ok=False)
    assert refused.returncode != 0
    assert f'CustomResourceDefinition "{CRD_NAME}"' in refused.stderr
    assert "invalid ownership metadata" in refused.stderr
    # ...until told to (docs/kubernetes.md, Upgrades).
    helm("upgrade", "ds", str(CHART), "--set", "example.enabled=true", "--take-ownership")
    new = crd(c)
    assert new["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert new["metadata"]["annotations"]["meta.helm.sh/release-name"] == "ds"
    assert new["spec"] == yaml.safe_load(CRD_FILE.read_text())["spec"]
    assert new["metadata"]["uid"] == old["metadata"]["uid"]  # upgraded, not replaced
    # The API server now serves the new schema: the new field is validated.
    bad = durable_stream("bad", {"primaryUpdateStrategy": "whenever"}, namespace=NS)
    assert c.create(bad).status_code == 422
    good = durable_stream("good", {"primaryUpdateStrategy": "supervised"}, namespace=NS)
    assert c.create(good).status_code == 201
    # The release's DurableStream and the user's: the same objects, the same specs but for
    # the new CRD's defaults, which reads now return (primaryUpdateStrategy) though
    # nothing was written (the same resourceVersion).
    schema = new["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    after = {n: identity(c.get("DurableStream", NS, n)) for n in ("events", "mine")}
    assert after == {
        n: (uid, crd_schema.on_read(schema, {"spec": spec})["spec"])
        for n, (uid, spec) in before.items()
    }
    assert after["mine"][1]["primaryUpdateStrategy"] == "unsupervised"
    assert c.get("DurableStream", NS, "mine")["metadata"]["resourceVersion"] == mine_version
    # helm uninstall: the operator goes, the CRD and every DurableStream stay.
    out = helm("uninstall", "ds").stdout
    assert "kept due to the resource policy" in out
    assert c.http.get(f"/apis/apps/v1/namespaces/{NS}/deployments").json()["items"] == []
    assert crd(c)["metadata"]["uid"] == old["metadata"]["uid"]
    names = sorted(d["metadata"]["name"] for d in c.list("DurableStream", NS))
    assert names == ["events", "good", "mine"]


def test_a_first_install_creates_the_crd_then_the_example_and_upgrades_adopt_it(
    kube: tuple[Cluster, Helm],
):
    """This chart alone: the CRD (a template) exists before the example (a post-install
    hook) is made; the next upgrade adopts the example; uninstall keeps both."""
    c, helm = kube
    helm("install", "ds", str(CHART), "--set", "example.enabled=true")
    assert crd(c)["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    example = c.get("DurableStream", NS, "events")
    assert example is not None
    helm("upgrade", "ds", str(CHART), "--set", "example.enabled=true")
    assert identity(c.get("DurableStream", NS, "events")) == identity(example)
    manifest = helm("get", "manifest", "ds").stdout
    assert "kind: DurableStream\n" in manifest and "kind: CustomResourceDefinition" in manifest
    helm("uninstall", "ds")
    assert crd(c) is not None
    assert identity(c.get("DurableStream", NS, "events")) == identity(example)


def test_crds_install_false_leaves_the_crd_to_its_owner(kube: tuple[Cluster, Helm]):
    c, helm = kube
    c.install_crd_file(CRD_FILE)  # applied by whoever manages CRDs here
    uid = crd(c)["metadata"]["uid"]
    helm("install", "ds", str(CHART), "--set", "crds.install=false")
    helm("upgrade", "ds", str(CHART), "--set", "crds.install=false")
    assert "meta.helm.sh/release-name" not in (crd(c)["metadata"].get("annotations") or {})
    helm("uninstall", "ds")
    assert crd(c)["metadata"]["uid"] == uid
