"""Generate manifests/ (plain YAML for ``kubectl apply``) from the Helm chart.

    python scripts/gen_manifests.py          # write
    python scripts/gen_manifests.py --check  # fail if manifests/ is stale

The chart is the source; a test runs --check so the two never drift.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from get_tools import ensure

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "durable-streams"
OUT = ROOT / "manifests"
NAMESPACE = "durable-streams"
HEADER = "# Generated from charts/durable-streams by scripts/gen_manifests.py; do not edit.\n"

FILES = {
    "rbac.yaml": {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"},
    "operator.yaml": {"Deployment", "Service", "NetworkPolicy"},
    "dashboard.yaml": {"ConfigMap"},
    "alerts.yaml": {"PrometheusRule"},
}

EXAMPLE = {
    "apiVersion": "streams.pyds.dev/v1alpha1",
    "kind": "DurableStream",
    # In the operator's own namespace: the only one it watches by default (namespaced RBAC).
    "metadata": {"name": "events", "namespace": NAMESPACE},
    "spec": {
        "image": "durable-streams-server:0.1.0",
        "replicas": 1,
        "storage": {"size": "10Gi", "pvcRetention": "Retain"},
        "server": {"longPollTimeoutSeconds": 30, "logFormat": "json"},
        "metrics": {"podMonitor": {"enabled": True}},
    },
}


def _template(*sets: str) -> list[dict]:
    helm = ensure() / "helm"
    args = [str(helm), "template", "durable-streams", str(CHART), "--namespace", NAMESPACE]
    for s in ("alerts.enabled=true", *sets):
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


# The operator over every namespace (operator.clusterWide): its RBAC and Deployment, in
# place of rbac.yaml and operator.yaml (the default watches the operator's namespace).
CLUSTER_WIDE = {
    "cluster-wide/rbac.yaml": FILES["rbac.yaml"],
    "cluster-wide/operator.yaml": FILES["operator.yaml"],
}


def render() -> dict[str, str]:
    docs = _template()
    files: dict[str, str] = {}
    for fname, kinds in FILES.items():
        chosen = [d for d in docs if d["kind"] in kinds]
        files[fname] = HEADER + yaml.safe_dump_all(chosen, sort_keys=False)
    wide = _template("operator.clusterWide=true")
    for fname, kinds in CLUSTER_WIDE.items():
        chosen = [d for d in wide if d["kind"] in kinds]
        files[fname] = HEADER + yaml.safe_dump_all(chosen, sort_keys=False)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    files["namespace.yaml"] = HEADER + yaml.safe_dump(ns, sort_keys=False)
    files["crd.yaml"] = HEADER + (CHART / "files" / "crds" / "durablestreams.yaml").read_text()
    files["crd-backup.yaml"] = (
        HEADER + (CHART / "files" / "crds" / "durablestreambackups.yaml").read_text()
    )
    files["examples/durablestream.yaml"] = HEADER + yaml.safe_dump(EXAMPLE, sort_keys=False)
    return files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(
            f"manifests out of date: {stale}; run python scripts/gen_manifests.py", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
