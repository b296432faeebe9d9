"""The chart rendered by real helm (``scripts/get_tools.py`` fetches it once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "durable-streams"


def helm_binary() -> str:
    sys.path.insert(0, str(ROOT / "scripts"))
    from get_tools import ensure

    return str(ensure() / "helm")


def helm_template(helm: str, *sets: str) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart with ``--set-json`` each of ``sets`` (not checked):
    ``--set`` would give ``2.5`` as a string."""
    args = [helm, "template", "rel", str(CHART), "--namespace", "ds"]
    for s in sets:
        args += ["--set-json", s]
    return subprocess.run(args, capture_output=True, text=True)


def rendered(helm: str, *sets: str) -> list[dict[str, Any]]:
    """The chart's objects with ``sets``; an error (with helm's message) when it fails."""
    proc = helm_template(helm, *sets)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def operator_env(helm: str, *sets: str) -> dict[str, str]:
    """The operator container's plain ``env`` values."""
    deployment = next(d for d in rendered(helm, *sets) if d["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}
