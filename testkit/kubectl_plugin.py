"""Running ``kubectl dstream`` as a user runs it, against the emulated API server: a
kubeconfig as kubectl writes one, and the plugin's console entry in a process of its
own (tests/operator/test_kubectl_plugin.py, test_kubectl_backup.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
NS = "team-a"  # the kubeconfig context's namespace: no -n needed


def kubeconfig(path: Path, url: str, namespace: str = NS) -> Path:
    """A kubeconfig as kubectl writes one: the emulated API server, a user, a context."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "not-checked"}}],
                "contexts": [
                    {
                        "name": "emulated",
                        "context": {
                            "cluster": "emulated",
                            "user": "tester",
                            "namespace": namespace,
                        },
                    },
                    {
                        "name": "elsewhere",
                        "context": {"cluster": "emulated", "user": "tester"},
                    },
                ],
                "current-context": "emulated",
            }
        )
    )
    return path


def environment(config: Path) -> dict[str, str]:
    tree = f"{ROOT / 'server'}{os.pathsep}{ROOT / 'operator'}{os.pathsep}{ROOT}"
    return {**os.environ, "KUBECONFIG": str(config), "PYTHONPATH": tree}


def plugin(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl dstream ARGS``: the plugin's console entry in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "stream_operator.kubectl_plugin", *args],
        env=environment(config),
        capture_output=True,
        text=True,
        timeout=120,
    )
