"""Each image holds the code of this checkout: the Python files of every package the
project's wheel installs, byte for byte.

A build cache that reuses an old layer (it keys a ``RUN`` on its text, not on the
wheels it bind-mounts) would otherwise leave an image that starts, answers and
passes a smoke test while running last week's server.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from testkit.containers import PODMAN_NEEDED

pytestmark = [pytest.mark.processes, PODMAN_NEEDED, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"stream_format": "server", "stream_server": "server", "stream_spark": "server",
            "stream_operator": "operator"}  # fmt: skip
# Run inside the image: every package's .py files and their sha256, by path in the package.
LIST = """
import hashlib, importlib.util, json, pathlib, sys
out = {}
for name in sys.argv[1:]:
    root = pathlib.Path(list(importlib.util.find_spec(name).submodule_search_locations)[0])
    for path in sorted(root.rglob("*.py")):
        out[f"{name}/{path.relative_to(root)}"] = hashlib.sha256(path.read_bytes()).hexdigest()
print(json.dumps(out))
"""


def checkout() -> dict[str, str]:
    out = {}
    for name, top in PACKAGES.items():
        root = ROOT / top / name
        for path in sorted(root.rglob("*.py")):
            out[f"{name}/{path.relative_to(root)}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize(
    "image", ["durable-streams-server", "durable-streams-operator", "durable-streams-spark"]
)
def test_the_image_holds_this_checkouts_code(podman, images, image):
    proc = podman.run_to_end(
        images[image], "-c", LIST, *PACKAGES, extra=["--entrypoint=/opt/venv/bin/python"]
    )
    assert proc.returncode == 0, proc.stderr
    inside = json.loads(proc.stdout)
    here = checkout()
    differ = sorted(p for p in here.keys() | inside.keys() if here.get(p) != inside.get(p))
    assert not differ, f"{image} differs from this checkout in {len(differ)} files: {differ[:10]}"
