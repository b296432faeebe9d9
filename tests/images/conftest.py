"""The three images, built once per test session, and the server image started as a pod would.

``images`` is ``testkit.images.build`` (what ``make images`` runs). What the
images weigh, how long they took and how long the server took to stop are
printed at the end of the session ("container images").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import images as images_here
from testkit import wait_for
from testkit.containers import Container, Podman
from testkit.servers import free_port, http_status


@pytest.fixture(scope="session")
def podman() -> Podman:
    return images_here.podman()


@pytest.fixture(scope="session")
def images(podman: Podman) -> dict[str, str]:
    """Image name -> reference, for images built from this tree (or found unchanged)."""
    return images_here.build(podman)


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
