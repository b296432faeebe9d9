"""The servers the benchmark measures, and what each of them needs installed.

Every run of a workload starts a fresh ``Server`` in its own temporary data
directory on a free port, waits until it is ready and stops it afterwards.
The process itself is a ``testkit.servers.Child``, as for the tests.

Nothing here installs anything: ``make deps`` does (the Python extras,
wrk and Node.js from scripts/system-deps.sh, the reference server with
``npm install`` in e2e/bench). ``missing()`` says what is not there.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench import log
from testkit.servers import Child, env_with, free_port, http_status, stream_server_command

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LONG_POLL_SECONDS = 20
REFERENCE_PACKAGE = "@durable-streams/server"
SERVERS = ("ours", "reference", "ceiling")
OURS = ("ours", "baseline")  # our server, now and at --baseline REF
INSTALL_ALL = "make deps installs everything the benchmark needs"


class Server:
    """One server process: ours (or a baseline checkout of it), the reference, the ceiling."""

    def __init__(self, kind: str, workdir: Path, source: Path = ROOT / "server") -> None:
        self.kind = kind
        self.workdir = workdir
        self.source = source  # the stream_server package to run (ours, baseline)
        self.port = free_port()
        self.data_dir: Path | None = None
        self.child: Child | None = None
        self.extra_args: list[str] = []  # more settings: ours' (archived), the ceiling's processes
        self.extra_env: dict[str, str] = {}

    def command(self) -> list[str]:
        assert self.data_dir is not None
        if self.kind in OURS:
            return stream_server_command(
                self.port,
                self.data_dir,
                "--host",
                "127.0.0.1",
                "--long-poll-timeout",
                str(LONG_POLL_SECONDS),
                *self.extra_args,
            )
        if self.kind == "reference":
            return [
                "node",
                str(HERE / "reference_server.mjs"),
                str(self.port),
                str(self.data_dir),
                str(LONG_POLL_SECONDS * 1000),
            ]
        return [sys.executable, str(HERE / "ceiling_app.py"), str(self.port), *self.extra_args]

    def start(self, data_dir: Path | None = None, timeout: float = 300) -> float:
        """Start the process; return the seconds from spawn to ready.

        Ready means GET /readyz answers 200 for ours; for the reference and the
        ceiling, which have no readiness endpoint, that any HTTP answer comes.
        """
        if data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix=f"{self.kind}-", dir=self.workdir))
        self.data_dir = data_dir
        env = env_with(pythonpath=self.source)
        env.setdefault("DS_LOG_LEVEL", "warning")
        env.update(self.extra_env)
        self.child = Child(
            self.kind,
            self.command(),
            self.workdir / f"{self.kind}-{self.port}.log",
            env=env,
            cwd=HERE,
            orphan_safe=True,
        )

        def ready() -> bool:
            status = http_status(self.port, "/readyz")
            return status == 200 or (status is not None and self.kind not in OURS)

        return self.child.start(ready, timeout=timeout, poll=0.01)

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.running

    def pids(self) -> list[int]:
        """The server's processes (a replica set: the primary first)."""
        return [self.child.proc.pid] if self.child and self.child.proc else []

    def log_tail(self) -> str:
        return self.child.log_tail(3000) if self.child else ""

    def rss(self) -> int:
        return self.child.rss() if self.child else 0

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s: the exit status (None: never started)."""
        return self.child.stop(timeout=timeout) if self.child else None

    def kill(self) -> None:
        """SIGKILL (a crash), and reap the process."""
        if self.child:
            self.child.kill()

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# ------------------------------------------------------- what is installed


def reference_version() -> str | None:
    """The installed version of the reference server in e2e/bench/node_modules, if any."""
    pkg = HERE / "node_modules" / REFERENCE_PACKAGE / "package.json"
    try:
        return json.loads(pkg.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def reference_wanted() -> str:
    return json.loads((HERE / "package.json").read_text())["dependencies"][REFERENCE_PACKAGE]


def missing(servers: list[str], *, wrk: bool) -> dict[str, str]:
    """What each of ``servers`` (and wrk, when ``wrk``) lacks to run here, and how to get it."""
    lacking: dict[str, str] = {}
    if wrk and shutil.which("wrk") is None:
        lacking["wrk"] = "wrk is not installed (Debian package wrk: make system-deps)"
    if "ours" in servers:
        if str(ROOT / "server") not in sys.path:
            sys.path.insert(0, str(ROOT / "server"))
        try:
            importlib.import_module("stream_server.server")  # and what it needs to serve
        except Exception as exc:  # any import failure: say which
            lacking["ours"] = (
                f"import stream_server failed: {exc!r} (the server extra: make deps, "
                "or pip install -e '.[server]')"
            )
    if "reference" in servers:
        installed, wanted = reference_version(), reference_wanted()
        if shutil.which("node") is None:
            lacking["reference"] = "Node.js is not installed (Debian package nodejs: make deps)"
        elif installed != wanted:
            lacking["reference"] = (
                f"{REFERENCE_PACKAGE} {wanted} is not installed in {HERE / 'node_modules'} "
                f"(found: {installed or 'none'}; make deps runs npm install there)"
            )
    if "ceiling" in servers:
        try:
            importlib.import_module("starlette")
            importlib.import_module("uvicorn")
        except ImportError as exc:
            lacking["ceiling"] = (
                f"Starlette/uvicorn missing: {exc!r} (make deps, or pip install -e '.[server]')"
            )
    return lacking


# ------------------------------------------------------------- --baseline


@contextlib.contextmanager
def baseline_checkout(ref: str | None, workdir: Path) -> Iterator[Path | None]:
    """The ``server/`` folder of a temporary git worktree at ``ref`` (None: no baseline)."""
    if ref is None:
        yield None
        return
    tree = workdir / "baseline"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    log(f"baseline: {ref} checked out in {tree}")
    try:
        yield tree / "server"
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )
