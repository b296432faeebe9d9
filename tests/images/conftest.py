"""The three images, built once per test session, and the server image started as a pod would.

``images`` runs ``scripts/build_images.py`` (what ``make images`` runs): it
builds the images whose inputs changed and reuses the others, so a session
with nothing changed pays about a second. What the images weigh, how long
they took and how long the server took to stop are printed at the end of
the session ("container images").
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import needs, summary, wait_for
from testkit.containers import INSTALL, PROGRAMS, Container, Podman, runc
from testkit.servers import free_port, http_status

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build_images.py"
SERVER_UID = 10001  # the server image's USER, and the pod's runAsUser/fsGroup
SPARK_UID = 185

BUILD_LOCK = Path(tempfile.gettempdir()) / "durable-streams-images.lock"


def report(line: str) -> None:
    """A line for the end-of-run summary: image sizes, build times, stop times."""
    summary.report("container images", line)


@pytest.fixture(scope="session")
def podman() -> Podman:
    if lacking := needs.absent(*PROGRAMS) + ([] if runc() else ["runc"]):
        needs.missing(f"{', '.join(lacking)} not installed: {INSTALL}")
    return Podman()


@pytest.fixture(scope="session")
def images(podman: Podman) -> dict[str, str]:
    """Image name -> reference, for images built from this tree (or found unchanged).

    Test workers (pytest-xdist) each have their own session: the lock makes the second
    wait for the first's build and then find the images unchanged."""
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
    for r in json.loads(proc.stdout):
        how = f"built in {r['seconds']:.0f} s" if r["built"] else "unchanged, reused"
        report(f"{r['ref']}: {r['size_bytes'] / 1e6:.0f} MB, {how} (base {r['base']})")
    return {r["name"]: r["ref"] for r in json.loads(proc.stdout)}


@dataclass
class ServerBox:
    """A server container and the host port it serves on (host network)."""

    box: Container
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/stream/"


ServeFn = Callable[..., ServerBox]


@pytest.fixture
def serve(podman: Podman, images: dict[str, str]) -> Iterator[ServeFn]:
    """Start the server image on a data directory as the operator's pod runs it (``serve``,
    read-only root, a writable /tmp, no capabilities, no privilege escalation); ready."""
    started: list[Container] = []

    def start(data: Path, **env: str) -> ServerBox:
        port = free_port()
        box = podman.run(
            images["durable-streams-server"],
            "serve",
            env={"DS_PORT": str(port), **env},
            volumes={data: "/data"},
            read_only=True,
            tmpfs=["/tmp"],
            extra=["--cap-drop=ALL", "--security-opt=no-new-privileges"],
        )
        started.append(box)
        try:
            wait_for(
                lambda: http_status(port, "/readyz", timeout=1) == 200 or not box.running(),
                timeout=60,
                message="the server container's /readyz",
            )
            assert box.running(), box.logs()
        except BaseException:
            print(box.logs())
            raise
        return ServerBox(box, port)

    yield start
    for box in started:
        box.remove()
