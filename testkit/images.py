"""The project's images for tests, as ``make images`` builds them from this tree.

``build`` runs ``scripts/build_images.py``: it builds the images whose inputs
changed and reuses the others, so a session with nothing changed pays about a
second. Test workers (pytest-xdist) each have their own session; a file lock
makes the second wait for the first's build and then find the images
unchanged. What the images weigh and how long they took goes into the
end-of-run summary ("container images").
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from testkit import needs, summary
from testkit.containers import INSTALL, PODMAN_NEEDED, PROGRAMS, Podman, runc
from testkit.pod_runtimes import Containers, Processes, Runtime

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "scripts" / "build_images.py"
BUILD_LOCK = Path(tempfile.gettempdir()) / "durable-streams-images.lock"
SUMMARY = "container images"
SERVER_UID = 10001  # the server image's USER, and the pod's runAsUser/fsGroup
SPARK_UID = 185  # the Spark image's USER


def report(line: str) -> None:
    """A line for the end-of-run summary: image sizes, build times, stop times."""
    summary.report(SUMMARY, line)


def podman() -> Podman:
    """Podman with this host's runtime; a missing program is reported as ``testkit.needs``
    does (a counted skip, a failure under ``make test``)."""
    if lacking := needs.absent(*PROGRAMS) + ([] if runc() else ["runc"]):
        needs.missing(f"{', '.join(lacking)} not installed: {INSTALL}")
    return Podman()


def build(podman: Podman) -> dict[str, str]:
    """Image name (``durable-streams-server``) -> local reference, built or found unchanged."""
    with open(BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            [sys.executable, str(BUILD), "--json"],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
            env={**os.environ, "PODMAN_RUNTIME": podman.runtime or ""},
        )
    if proc.returncode != 0:
        pytest.fail(f"building the images failed:\n{proc.stderr[-5000:]}", pytrace=False)
    built = json.loads(proc.stdout)
    for r in built:
        how = f"built in {r['seconds']:.0f} s" if r["built"] else "unchanged, reused"
        summary.report(
            SUMMARY, f"{r['ref']}: {r['size_bytes'] / 1e6:.0f} MB, {how} (base {r['base']})"
        )
    return {r["name"]: r["ref"] for r in built}


# The two ways a kubelet stand-in test runs its pods (``pod_runtime``), as fixture params.
POD_RUNTIMES = [
    "processes",
    pytest.param("containers", marks=[PODMAN_NEEDED, pytest.mark.timeout(1800)]),
]


@contextmanager
def pod_runtime(kind: str, image: str, also: Sequence[str] = ()) -> Iterator[Runtime]:
    """How the kubelet stand-in runs pods: ``processes`` of this checkout, or
    ``containers`` of the server image built from it, which a template names as
    ``image``; each name in ``also`` (a version a test rolls to) is one more tag of the
    same build, removed at the end."""
    if kind == "processes":
        yield Processes()
        return
    engine = podman()
    server = build(engine)["durable-streams-server"]
    tags = {name: f"localhost/{name}" for name in also}
    for tag in tags.values():
        engine.call("tag", server, tag)
    try:
        yield Containers(engine, {image: server, **tags})
    finally:
        for tag in tags.values():
            engine.call("untag", server, tag, check=False)
