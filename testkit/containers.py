"""Containers for tests: podman run, exec, stop and remove, with the flags this machine needs.

Every container a test starts needs the same handful of flags: the ``runc``
runtime (Debian's default ``crun`` fails on hosts with hybrid cgroups), the
host's network (the test talks to it on 127.0.0.1, and it reaches the
emulated API server there), and open-file and process limits no higher than
the host's hard limits (podman's defaults are above them on these machines,
and the container then fails to start with "setrlimit ... not permitted").
``Podman`` adds them; ``Container`` is one started container, removed when
its ``with`` block ends even if the test failed.

    podman = Podman()
    with podman.run(image, "serve", env={"DS_PORT": "4437"}, volumes={data: "/data"}) as box:
        box.exec("id", "-u")
        took = box.stop(grace=30)   # SIGTERM, seconds it took to exit
        assert box.exit_code() == 0

Tests that need podman declare it with ``PODMAN_NEEDED`` (testkit.needs).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit import needs

PROGRAMS = ("podman", "mmdebstrap")  # and runc, in /usr/sbin: see runc()
INSTALL = "Debian's podman, runc, mmdebstrap and uidmap (make system-deps)"
# The mark for tests that run containers: skipped without podman, failed under make test.
PODMAN_NEEDED = needs.commands(*PROGRAMS, install=INSTALL)
# Every container a test starts carries this label (``podman ps -a --filter label=...``).
TEST_LABEL = "dev.pyds.test=1"


def runc() -> str | None:
    """runc's path: Debian puts it in /usr/sbin, which a user's PATH may lack."""
    return shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")


def _limit(which: int, wanted: int) -> int:
    hard = resource.getrlimit(which)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


class Podman:
    """The podman command line, with the runtime and limits that work on this host."""

    def __init__(self, runtime: str | None = None) -> None:
        self.runtime = runtime or os.environ.get("PODMAN_RUNTIME") or runc()

    def cmd(self, *args: str) -> list[str]:
        head = ["podman"]
        if self.runtime:
            head += ["--runtime", self.runtime]
        return [*head, *args]

    def call(
        self, *args: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.cmd(*args), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def run_flags(
        self,
        *,
        env: Mapping[str, str] | None = None,
        volumes: Mapping[Path | str, str] | None = None,
        read_only: bool = False,
        tmpfs: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> list[str]:
        """``podman run`` options: host network, this host's limits, the test label, and
        ``volumes`` as ``{host path: "container path[:ro]"}``."""
        nofile = _limit(resource.RLIMIT_NOFILE, 20000)
        nproc = _limit(resource.RLIMIT_NPROC, 4096)
        flags = [
            "--network=host",
            f"--ulimit=nofile={nofile}:{nofile}",
            f"--ulimit=nproc={nproc}:{nproc}",
            f"--label={TEST_LABEL}",
        ]
        for key, value in (env or {}).items():
            flags.append(f"--env={key}={value}")
        for host, inside in (volumes or {}).items():
            flags.append(f"--volume={host}:{inside}")
        if read_only:
            # As a pod's readOnlyRootFilesystem: nothing writable but what is mounted.
            flags += ["--read-only", "--read-only-tmpfs=false"]
        flags += [f"--tmpfs={path}" for path in tmpfs]
        return [*flags, *extra]

    def run(self, image: str, *args: str, **options: Any) -> Container:
        """Start ``image`` detached (``args`` after its entrypoint); see ``run_flags``."""
        name = f"ds-test-{uuid.uuid4().hex[:10]}"
        self.call("run", "--detach", f"--name={name}", *self.run_flags(**options), image, *args)
        return Container(self, name)

    def run_to_end(
        self, image: str, *args: str, timeout: float = 300, **options: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``image`` in the foreground until it exits; the container is removed."""
        return self.call(
            "run", "--rm", *self.run_flags(**options), image, *args, timeout=timeout, check=False
        )

    def own(self, path: Path, uid: int) -> Path:
        """Make ``path`` (a directory to mount) belong to ``uid`` as the container sees it,
        as a pod's fsGroup makes its volume the pod user's; rootless podman maps ids."""
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(path, uid, uid)
        else:
            self.call("unshare", "chown", f"{uid}:{uid}", str(path))
        return path

    def image_size(self, image: str) -> int:
        found = json.loads(self.call("image", "inspect", image).stdout)
        return int(found[0].get("Size") or 0)


class Container:
    """One container started by ``Podman.run``; a context manager that removes it."""

    def __init__(self, podman: Podman, name: str) -> None:
        self.podman = podman
        self.name = name

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def exec(self, *command: str, timeout: float = 60) -> str:
        """``command`` inside the running container; its stdout (RuntimeError if it fails)."""
        return self.podman.call("exec", self.name, *command, timeout=timeout).stdout

    def logs(self) -> str:
        proc = self.podman.call("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def state(self) -> dict[str, Any]:
        found = json.loads(self.podman.call("container", "inspect", self.name).stdout)
        return dict(found[0]["State"])

    def running(self) -> bool:
        return bool(self.state().get("Running"))

    def exit_code(self) -> int:
        return int(self.state()["ExitCode"])

    def stop(self, grace: float) -> float:
        """SIGTERM, then SIGKILL after ``grace`` seconds (a pod's termination grace
        period); the seconds from the request until the container had exited."""
        started = time.monotonic()
        self.podman.call("stop", f"--time={round(grace)}", self.name, timeout=grace + 60)
        return time.monotonic() - started

    def start(self) -> None:
        """Start the stopped container again (same filesystem, same volumes)."""
        self.podman.call("start", self.name)

    def remove(self) -> None:
        self.podman.call("rm", "--force", "--time=0", self.name, check=False)
