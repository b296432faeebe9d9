"""A replica set on one machine: the emulated Kubernetes API and N stream servers.
Kept whole although long: the command line and the Python API drive one state file.

This is how a user tries failover on a laptop and how the replication tests
run (docs/replication.md, "Trying it on a laptop")::

    python -m testkit.replicaset up --replicas 3 --state-file rs.json
    python -m testkit.replicaset restart ds-0 --state-file rs.json
    python -m testkit.replicaset switchover --state-file rs.json [--to ds-1]
    python -m testkit.replicaset down --state-file rs.json

``up`` starts the emulated API server (``python -m testkit.kube_serve``) and
N ``stream_server serve`` processes, each with its own port, data directory
and log file, all in sessions of their own so that they outlive the command
(and a Ctrl-C in its terminal). The state file is the only record of them::

    {"api": URL, "lease": "default/durable-streams", "replication": true,
     "api_pid": PID, "data_root": DIR, "token_file": FILE,
     "servers": [{"name", "url", "pid", "data_dir", "log", "command", "env"}]}

``token_file`` holds the set's peer token (``--replication-token-file``, a
fresh random secret per ``up``): every server gets it, so the peer endpoints
(stream, snapshot, switchover) are authenticated in every test that uses the
set, and ``switchover`` sends it.

``url`` is an origin (streams live under ``/v1/stream/``); ``command`` and
``env`` (the ``DS_*`` settings given to that server) are what ``restart``
starts again, so a restart is the same server on the same port and data.

The fault tests (``testkit.faults``) start a process differently through
``up(launch=...)``: on another address, behind a command prefix that execs
it (``ip netns exec NS``: a network namespace of its own), with more
environment (a slowed clock, its own proxy to the API). A server's
``prefix`` is recorded with it (``api_prefix`` for the API server) and used
again by ``restart``; ``command`` stays what the process runs once the
prefix has exec'd it, which is what a pid is checked against.

Signals go to each child's process group (its session), so a server's own
helper processes go with it, as a container's do; and a pid is only ever
signalled after /proc shows it still runs the command the state file
recorded, so a stale state file cannot hit an unrelated process.

When the installed server has no replication settings yet (``serve --help``
lists no ``--replication-lease``), the servers run in single-node mode and
the state file says ``"replication": false``; everything else works the same.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testkit.servers import env_with, free_port, http_status, stream_server_command

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LEASE = "default/durable-streams"
NAME_PREFIX = "ds-"  # replica names as a StatefulSet names its pods: ds-0, ds-1, ...
START_TIMEOUT = 60.0  # seconds a child may take to answer at all (2 shared cores)
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL in down()


@functools.cache
def replication_supported() -> bool:
    """Whether the installed server knows the replication settings (``--replication-lease``)."""
    out = subprocess.run(
        [sys.executable, "-m", "stream_server", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_with(),
    )
    return "--replication-lease" in out.stdout


@dataclass
class Launch:
    """How one process is started beyond its own command (``ReplicaSet.up(launch=...)``)."""

    host: str = "127.0.0.1"  # the address it listens on, and others reach it at
    prefix: list[str] = field(default_factory=list)  # runs it; must exec it (ip netns exec NS)
    env: dict[str, str] = field(default_factory=dict)  # more environment, over the settings'


@dataclass
class Replica:
    """One server of the set, as the state file records it."""

    name: str
    url: str
    pid: int
    data_dir: str
    log: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1].rsplit(":", 1)[0]

    @property
    def base(self) -> str:
        """The stream base URL on this server."""
        return f"{self.url}/v1/stream/"


# -- processes ----------------------------------------------------------------------------


def _cmdline(pid: int) -> list[str] | None:
    """The command a live (not zombie) process runs, or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return None
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def runs(pid: int, command: list[str]) -> bool:
    """Whether ``pid`` is alive and running ``command`` (not a recycled pid)."""
    return pid > 0 and _cmdline(pid) == command


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _spawn(
    command: list[str], log: Path, extra_env: dict[str, str], prefix: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` detached (a session of its own), its output appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*(prefix or []), *command],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env_with(extra_env, pythonpath=ROOT),
            start_new_session=True,
        )


def _log_tail(path: Path | str, chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# -- the set ------------------------------------------------------------------------------


class ReplicaSet:
    """The API server and the servers one state file records; made by ``up`` or ``load``.

    Processes this object started are also reaped by it (so a killed server
    is gone, not a zombie, the moment ``kill`` returns).
    """

    def __init__(self, state_file: Path, state: dict[str, Any]) -> None:
        self.state_file = Path(state_file)
        self.api: str = state["api"]
        self.api_pid: int = state["api_pid"]
        self.api_command: list[str] = state["api_command"]
        self.api_prefix: list[str] = state.get("api_prefix", [])
        self.lease: str = state["lease"]
        self.replication: bool = state["replication"]
        self.data_root = Path(state["data_root"])
        self.token_file: str = state.get("token_file", "")
        self.servers = [Replica(**s) for s in state["servers"]]
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- building ---------------------------------------------------------------------

    @classmethod
    def up(
        cls,
        n: int,
        data_root: Path,
        *,
        state_file: Path | None = None,
        base_port: int | None = None,
        lease: str = DEFAULT_LEASE,
        settings: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        order: tuple[int, ...] | None = None,
        launch: Callable[[str, str], Launch] | None = None,
    ) -> ReplicaSet:
        """Start the API server and ``n`` servers; write and return the state.

        ``settings`` are further server settings by name (``lease_duration``:
        ``DS_LEASE_DURATION``), ``args`` further command-line flags. With
        ``base_port`` the API listens on it and server i on ``base_port + 1 + i``.
        ``order`` is the order the servers start in (default: ds-0 first), each
        once it answers; a data directory already at ``data_root/ds-i`` is used.
        ``launch(name, api)`` says how each process is started (``Launch``): asked
        for the API server first (name ``kube-api``, api ``""``), then for each
        server with the API's URL. Whatever started is stopped again when a later
        part fails to start.
        """
        if not 1 <= n <= 5:
            raise ValueError(f"a replica set has 1 to 5 servers, not {n}")
        if order is not None and sorted(order) != list(range(n)):
            raise ValueError(f"order must name each of the {n} servers once, not {order}")
        namespace, sep, name = lease.partition("/")
        if not (sep and namespace and name):
            raise ValueError(f"the lease must be 'namespace/name', not {lease!r}")
        data_root = Path(data_root).resolve()
        data_root.mkdir(parents=True, exist_ok=True)
        state_file = Path(state_file or data_root / "replicaset.json").resolve()
        api_port = base_port if base_port is not None else free_port()
        api_launch = launch("kube-api", "") if launch is not None else Launch()
        api_command = [
            sys.executable,
            "-m",
            "testkit.kube_serve",
            "--port",
            str(api_port),
        ]
        if api_launch.host != Launch.host:
            api_command += ["--host", api_launch.host]
        rs = cls(
            state_file,
            {
                "api": f"http://{api_launch.host}:{api_port}",
                "api_pid": 0,
                "api_command": api_command,
                "api_prefix": api_launch.prefix,
                "lease": lease,
                "replication": replication_supported(),
                "data_root": str(data_root),
                "token_file": "",
                "servers": [],
            },
        )
        if rs.replication:
            token = data_root / "replication-token"
            token.touch(mode=0o600)
            token.write_text(secrets.token_urlsafe(32) + "\n")
            rs.token_file = str(token)
        try:
            api = _spawn(api_command, data_root / "kube-api.log", api_launch.env, api_launch.prefix)
            rs.api_pid = api.pid
            rs._children[api.pid] = api
            rs._wait_ready(
                "the emulated API server",
                api,
                data_root / "kube-api.log",
                lambda: (
                    http_status(
                        api_port, "/api/v1/namespaces/default/configmaps", host=api_launch.host
                    )
                    == 200
                ),
            )
            extra = {f"DS_{k.upper()}": str(v) for k, v in (settings or {}).items()}
            for i in range(n):
                port = base_port + 1 + i if base_port is not None else free_port()
                name = f"{NAME_PREFIX}{i}"
                how = launch(name, rs.api) if launch is not None else Launch()
                rs.servers.append(rs._replica(name, port, n, extra, args, how))
            for i in order if order is not None else range(n):
                rs._start(rs.servers[i])
            rs.save()
        except BaseException:
            rs.down(grace=2)
            raise
        return rs

    def _replica(
        self,
        name: str,
        port: int,
        n: int,
        extra: dict[str, str],
        args: tuple[str, ...],
        how: Launch,
    ) -> Replica:
        url = f"http://{how.host}:{port}"
        if how.host != Launch.host:
            args = ("--host", how.host, *args)
        data_dir = self.data_root / name
        env = dict(extra)
        if self.replication:
            env |= {
                "DS_REPLICATION_LEASE": self.lease,
                "DS_REPLICA_NAME": name,
                "DS_REPLICA_URL": url,
                "DS_KUBE_API": self.api,
                "DS_REPLICATION_SET_SIZE": str(n),
                # Only ds-0 starts the set from empty storage (docs/replication.md).
                "DS_REPLICATION_BOOTSTRAP": f"{NAME_PREFIX}0",
            }
            if self.token_file:
                env["DS_REPLICATION_TOKEN_FILE"] = self.token_file
        env |= how.env
        return Replica(
            name=name,
            url=url,
            pid=0,
            data_dir=str(data_dir),
            log=str(self.data_root / f"{name}.log"),
            command=stream_server_command(port, data_dir, *args),
            env=env,
            prefix=list(how.prefix),
        )

    @classmethod
    def load(cls, state_file: Path) -> ReplicaSet:
        """The set a state file records (written by ``up``, kept current by ``restart``)."""
        return cls(Path(state_file), json.loads(Path(state_file).read_text()))

    def save(self) -> None:
        state = {
            "api": self.api,
            "api_pid": self.api_pid,
            "api_command": self.api_command,
            "api_prefix": self.api_prefix,
            "lease": self.lease,
            "replication": self.replication,
            "data_root": str(self.data_root),
            "token_file": self.token_file,
            "servers": [asdict(s) for s in self.servers],
        }
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    # -- one server -------------------------------------------------------------------

    def server(self, name: str) -> Replica:
        for s in self.servers:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.servers)
        raise KeyError(f"no server {name!r} in this replica set (it has {known})")

    def _start(self, replica: Replica) -> None:
        Path(replica.data_dir).mkdir(parents=True, exist_ok=True)
        proc = _spawn(replica.command, Path(replica.log), replica.env, replica.prefix)
        replica.pid = proc.pid
        self._children[proc.pid] = proc
        # /healthz, not /readyz: a standby that is still catching up is started, not ready.
        self._wait_ready(
            f"server {replica.name}",
            proc,
            Path(replica.log),
            lambda: http_status(replica.port, "/healthz", timeout=1, host=replica.host) == 200,
        )

    def _wait_ready(
        self, what: str, proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], bool]
    ) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{what} exited with {proc.returncode} at start:\n{_log_tail(log)}"
                )
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{what} did not answer in {START_TIMEOUT} s:\n{_log_tail(log)}")

    def alive(self, name: str) -> bool:
        replica = self.server(name)
        self._reap(replica.pid)
        return runs(replica.pid, replica.command)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a server's process group; for SIGKILL, wait until it is gone."""
        replica = self.server(name)
        if not runs(replica.pid, replica.command):
            raise RuntimeError(f"server {name} is not running (pid {replica.pid})")
        os.killpg(replica.pid, sig)
        if sig == signal.SIGKILL:
            self._wait_gone(replica.pid, timeout=10)

    def restart(self, name: str) -> Replica:
        """Start a stopped server again, same command, port and data; record its new pid."""
        replica = self.server(name)
        self._reap(replica.pid)
        if runs(replica.pid, replica.command):
            raise RuntimeError(f"server {name} is still running (pid {replica.pid})")
        self._start(replica)
        self.save()
        return replica

    def _reap(self, pid: int) -> None:
        proc = self._children.get(pid)
        if proc is not None and proc.poll() is not None:
            del self._children[pid]

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        """Wait until ``pid``'s process group is empty; False when it is not in time."""
        deadline = time.monotonic() + timeout
        while True:
            self._reap(pid)
            if not _group_alive(pid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def down(self, grace: float = STOP_GRACE) -> None:
        """Stop every server, then the API server: SIGTERM, SIGKILL after ``grace`` s."""
        groups = [s.pid for s in self.servers if runs(s.pid, s.command)]
        for pid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        self._finish(groups, grace)
        if runs(self.api_pid, self.api_command):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.api_pid, signal.SIGTERM)
            self._finish([self.api_pid], grace)

    def _finish(self, groups: list[int], grace: float) -> None:
        deadline = time.monotonic() + grace
        for pid in groups:
            if not self._wait_gone(pid, max(0.0, deadline - time.monotonic())):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._wait_gone(pid, timeout=10)

    # -- replication status -----------------------------------------------------------

    def status(self, name: str, *, timeout: float = 2.0) -> dict[str, Any] | None:
        """A server's ``GET /replication``, or None when it does not answer it."""
        try:
            r = httpx.get(f"{self.server(name).url}/replication", timeout=timeout)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        body: dict[str, Any] = r.json()
        return body

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {s.name: self.status(s.name) for s in self.servers}

    def primary(self, *, timeout: float = 60.0, exclude: tuple[str, ...] = ()) -> Replica:
        """The primary, once exactly one server (outside ``exclude``) says it is primary.

        ``exclude`` names servers that must not count (a killed or paused former
        primary). Raises RuntimeError with every server's status when no single
        primary shows within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            seen = {s.name: self.status(s.name) for s in self.servers if s.name not in exclude}
            primaries = [n for n, st in seen.items() if st and st.get("role") == "primary"]
            if len(primaries) == 1:
                return self.server(primaries[0])
            if time.monotonic() > deadline:
                raise RuntimeError(f"no single primary after {timeout} s: {seen}")
            time.sleep(0.1)

    def peer_headers(self) -> dict[str, str]:
        """The peer token as the servers ask for it (none when the set has no token)."""
        if not self.token_file:
            return {}
        return {"Authorization": f"Bearer {Path(self.token_file).read_text().strip()}"}

    def switchover(self, to: str | None = None, *, timeout: float | None = None) -> httpx.Response:
        """``POST /replication/switchover`` on the primary (with the peer token); its
        answer as it came: 200 ``{"primary", "term", "paused_ms"}``, or the refusal."""
        primary = self.primary(timeout=10.0)
        body: dict[str, Any] = {}
        if to is not None:
            body["to"] = to
        if timeout is not None:
            body["timeout"] = timeout
        return httpx.post(
            f"{primary.url}/replication/switchover",
            json=body,
            headers=self.peer_headers(),
            timeout=(timeout or 10.0) + 10.0,
        )


# -- the command line ---------------------------------------------------------------------


def _setting(raw: str) -> tuple[str, str]:
    name, sep, value = raw.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {raw!r}")
    return name.strip().lower().replace("-", "_"), value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.replicaset",
        description="A replica set on one machine: the emulated Kubernetes API and N servers.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the API server and N servers, write the state file")
    up.add_argument("--replicas", type=int, default=3, help="servers in the set (1 to 5)")
    up.add_argument("--state-file", type=Path, required=True)
    up.add_argument(
        "--base-port",
        type=int,
        help="the API on this port, server i on base-port+1+i (default: free ports)",
    )
    up.add_argument(
        "--data-root",
        type=Path,
        help="data directories and logs (default: <state file>-data next to the state file)",
    )
    up.add_argument("--lease", default=DEFAULT_LEASE, help="namespace/name of the Lease")
    up.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a further server setting, e.g. --set lease_duration=4 (repeat the flag)",
    )
    down = sub.add_parser("down", help="stop every process the state file records")
    down.add_argument("--state-file", type=Path, required=True)
    down.add_argument("--grace", type=float, default=STOP_GRACE, help="seconds before SIGKILL")
    restart = sub.add_parser("restart", help="start one stopped server again")
    restart.add_argument("name")
    restart.add_argument("--state-file", type=Path, required=True)
    status = sub.add_parser("status", help="print every server's GET /replication")
    status.add_argument("--state-file", type=Path, required=True)
    switch = sub.add_parser(
        "switchover", help="hand the primary role to an in-sync standby, losing nothing"
    )
    switch.add_argument("--state-file", type=Path, required=True)
    switch.add_argument("--to", help="the standby to promote (default: the most advanced)")
    switch.add_argument("--timeout", type=float, help="seconds the switch may take (default 10)")
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            state_file = args.state_file.resolve()
            data_root = args.data_root or state_file.with_name(state_file.stem + "-data")
            rs = ReplicaSet.up(
                args.replicas,
                data_root,
                state_file=state_file,
                base_port=args.base_port,
                lease=args.lease,
                settings=dict(args.settings),
            )
            if not rs.replication:
                print(
                    "warning: this server has no replication settings yet "
                    "(serve --help lists no --replication-lease): "
                    "the servers run in single-node mode",
                    file=sys.stderr,
                )
            print(f"api  {rs.api}  (pid {rs.api_pid})")
            for s in rs.servers:
                print(f"{s.name}  {s.url}  (pid {s.pid}, data {s.data_dir}, log {s.log})")
            print(f"state file: {state_file}")
        elif args.command == "down":
            ReplicaSet.load(args.state_file).down(grace=args.grace)
        elif args.command == "restart":
            s = ReplicaSet.load(args.state_file).restart(args.name)
            print(f"{s.name}  {s.url}  (pid {s.pid})")
        elif args.command == "switchover":
            r = ReplicaSet.load(args.state_file).switchover(args.to, timeout=args.timeout)
            print(r.text.strip())
            if r.status_code != 200:
                print(f"error: the primary answered {r.status_code}", file=sys.stderr)
                return 1
        else:
            for name, st in ReplicaSet.load(args.state_file).statuses().items():
                print(f"{name}  {json.dumps(st) if st is not None else 'not answering'}")
    except (RuntimeError, KeyError, ValueError, OSError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
