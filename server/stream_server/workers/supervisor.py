"""The writer's worker processes: started on the pod's port, replaced when one dies,
stopped before the writer.

The writer binds the port once (so a port in use stops the start with one clear
error) and every worker inherits that listening socket: the kernel hands each new
connection to one of them. A worker is the same program started with the
``worker`` command (``python -m stream_server worker``), its settings and the
writer's two sockets in its environment. A worker that exits while the writer
runs is replaced (after a pause that grows while they keep dying, so a worker that
cannot start does not spin); at shutdown the workers stop first, finishing their
requests while the writer can still commit them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from stream_server.config import Settings

log = logging.getLogger("stream_server.workers")

SETTINGS_ENV = "DS_WORKER_SETTINGS"  # the writer's settings, pickled and base64'd
FD_ENV = "DS_WORKER_FD"  # the inherited listening socket
LINK_ENV = "DS_WORKER_LINK"  # the writer's link socket
HTTP_ENV = "DS_WORKER_HTTP"  # the writer's own HTTP socket
# The directory of the workers' metrics files (prometheus_client's multiprocess mode,
# read from the environment when a worker imports it): the writer's scrape sums them.
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"

FIRST_PAUSE = 0.5  # seconds before a dead worker is replaced; doubles while they keep dying
LONGEST_PAUSE = 10.0
STEADY = 30.0  # a worker that lived this long resets the pause


def cpu_count() -> int:
    """The CPUs this process may use: the cgroup's quota where one is set (a pod's CPU
    limit), else the CPUs it may run on; at least one."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_quota(Path("/sys/fs/cgroup/cpu.max"))
    count = min(allowed or 1, quota) if quota is not None else allowed or 1
    return max(1, count)


def _cgroup_quota(path: Path) -> int | None:
    """cgroup v2's ``cpu.max`` (``max 100000`` or ``200000 100000``) as whole CPUs,
    rounded up; None when there is no quota."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, -(-int(quota) // int(period)))


@dataclass(frozen=True)
class Sockets:
    """The writer's two local sockets in a directory only its user may enter, and
    there the directory of the workers' metrics (None: no metrics)."""

    link: Path
    http: Path
    metrics: Path | None = None


def worker_env(settings: Settings, sock: socket.socket, sockets: Sockets) -> dict[str, str]:
    env = dict(os.environ)
    env[SETTINGS_ENV] = base64.b64encode(pickle.dumps(settings)).decode()
    env[FD_ENV] = str(sock.fileno())
    env[LINK_ENV] = str(sockets.link)
    env[HTTP_ENV] = str(sockets.http)
    env.pop(METRICS_ENV, None)
    if sockets.metrics is not None:
        env[METRICS_ENV] = str(sockets.metrics)
    return env


def worker_settings() -> Settings:
    """A worker's settings: the writer's, as it passed them."""
    settings: Settings = pickle.loads(base64.b64decode(os.environ[SETTINGS_ENV]))
    return settings


class Supervisor:
    """Keeps ``count`` workers running on ``sock`` until ``stop``."""

    def __init__(
        self, settings: Settings, count: int, sock: socket.socket, sockets: Sockets
    ) -> None:
        self.settings = settings
        self.count = count
        self.sock = sock
        self.sockets = sockets
        self.stopping = False
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for index in range(self.count):
            await self._spawn(index)
            self.tasks.append(asyncio.create_task(self._keep(index), name=f"worker {index}"))

    async def _spawn(self, index: int) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "stream_server",
            "worker",
            env=worker_env(self.settings, self.sock, self.sockets),
            pass_fds=(self.sock.fileno(),),
        )
        self.procs[index] = proc
        log.info("worker %d started (pid %d)", index, proc.pid)

    async def _keep(self, index: int) -> None:
        """Wait for worker ``index`` to exit, and start another unless stopping."""
        pause = FIRST_PAUSE
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            status = await self.procs[index].wait()
            if self.stopping:
                return
            log.error("worker %d exited with status %s: starting another", index, status)
            if loop.time() - started > STEADY:
                pause = FIRST_PAUSE
            await asyncio.sleep(pause)  # a worker that cannot start must not spin
            pause = min(pause * 2, LONGEST_PAUSE)
            if self.stopping:
                return
            await self._spawn(index)

    async def stop(self, grace: float) -> None:
        """SIGTERM every worker and wait up to ``grace`` seconds; then SIGKILL."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        waits = [p.wait() for p in self.procs.values()]
        try:
            async with asyncio.timeout(grace):
                await asyncio.gather(*waits)
        except TimeoutError:
            for proc in self.procs.values():
                if proc.returncode is None:
                    log.warning("worker pid %d did not stop in %.0f s: killed", proc.pid, grace)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.gather(*(p.wait() for p in self.procs.values()))
        for task in self.tasks:
            task.cancel()
