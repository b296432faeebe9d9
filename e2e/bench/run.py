"""Side-by-side benchmark: our server, the Node reference server, the HTTP ceiling.

One module over 400 lines on purpose: it is the command line and the one loop that
runs every workload on every column; the workloads, servers and report are modules
of their own (workloads.py, servers.py, report.py).

    python e2e/bench/run.py                      # full profile (20 to 25 minutes)
    python e2e/bench/run.py --quick              # smoke profile (about 40 s)
    python e2e/bench/run.py --only live,idle --servers ours,reference
    python e2e/bench/run.py --quick --json out.json
    python e2e/bench/run.py --baseline HEAD~3     # ours now against ours at a git ref
    python e2e/bench/run.py --only replicated --servers ours --repeat 3   # 3 replicas vs 1
    python e2e/bench/run.py --only archived --servers ours --repeat 3     # archive on vs off
    python e2e/bench/run.py --only workers --servers ours --repeat 3      # 2 workers vs 1
    python e2e/bench/run.py --only many --servers ours,reference --many-streams 100000

With ``--baseline REF`` the comparison column is this server as of REF (checked
out into a temporary git worktree and run from there) instead of the reference:
the before/after of a change in one run, on the same machine and disk.

Everything runs on this machine in one go. Each workload starts a fresh
server in its own temporary data directory on a free port (ours, then the
reference), waits until it is ready, prepares its streams, measures, and
stops it; with --quick, a smoke, the workloads before the restart share one
server per column (``SHARED_QUICK``). Both servers run with the same
long-poll timeout (20 s) and keep their durability: they fdatasync before
acknowledging, nothing here turns that off. Load comes from wrk (appends, with the Lua scripts next to this
file) and, where wrk cannot do the job (chained catch-up reads, long-poll
wake latency, 1,000 idle readers, restart), from raw blocking or epoll
sockets in this process: the leanest client Python has.

The replicated workload (replicated.py) runs the 64 x 64 and sequential
appends on a 3-replica set (testkit.replicaset: the emulated Lease API and
three servers on this machine) and on single-node ours, alternating, and
reports the set against single-node, with the standbys' lag; it needs ours
in --servers. The archived workload (archived.py) runs the same two on ours
with the object-store archive on (a real SeaweedFS) and off, alternating, with
the archive's lag. The workers workload (workers.py) runs ours with
--workers N (--workers-count, 2 by default) against --workers 1, alternating:
the 64 x 64 and 64 x 1 appends, the binary catch-up, live long-poll and idle
waiters, CPU per append of all the server's processes and of the writer (the
main process) alone, the appends/s an Amdahl model of that allows on 4, 8 and
16 cores, and each side's share of the HTTP ceiling run in as many processes
(about 3 minutes; 40 s with --quick).

The many-streams workload (many_streams.py, --only many) holds N small
streams on one server (--many-streams N; 100,000, or 2,000 with --quick):
N creates, then one 100-byte append each with every append's latency (p50,
p99, max, how many over 1 s, and our checkpoint windows, seen in the data
directory's wal/, set against the slowest), RSS and disk per stream, the
clean stop (seconds, exit status), the restart, then appends to half the
streams, kill -9 and the restart again; a sample of the streams is read
back after each start. The reference's appends go over one connection (it
answers 404 to appends to many streams at once), so at 100,000 streams the
workload takes about 15 minutes of the full profile.

The ceiling is ceiling_app.py, a Starlette app answering POST with 204 under
our uvicorn settings, driven exactly like the 64 x 64 append workload.

The table gives each workload, ours, the reference, ours/reference, the
target from the performance issue and whether ours meets it. Every server
named in --servers must run: when one cannot (`import stream_server`
fails, Node.js or the reference's npm package is missing, Starlette or
uvicorn is missing, wrk is missing), the harness says what is missing and
exits with status 2 before measuring anything. It installs nothing itself:
`make deps` installs all of it. Exit status 1: a workload failed on a
server (the table still prints, the error is listed under it).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the bench package and testkit
    sys.path[0:1] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

import argparse
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field

from bench import log
from bench.archived import run_archived
from bench.machine import disk_syncs_per_s, raise_fd_limit, versions
from bench.many_streams import describe
from bench.replicated import REPLICAS, run_replicated
from bench.report import (
    as_json,
    build_archived_rows,
    build_replicated_rows,
    build_rows,
    short,
    table,
)
from bench.results import CeilingResult, ManyStreamsResult, Profile, Result, WorkersResult, merge
from bench.servers import (
    INSTALL_ALL,
    LONG_POLL_SECONDS,
    SERVERS,
    Server,
    baseline_checkout,
    missing,
)
from bench.workers import build_workers_rows, describe_model, model, run_workers
from bench.workloads import CEILING_WORKLOAD, KEYS, WORKLOADS, Workload, ceiling_appends

REPLICATED = "replicated"  # a workload of its own: the replica set against single-node ours
ARCHIVED = "archived"  # ours with the object-store archive on against off
WORKERS = "workers"  # ours with --workers N against --workers 1
SIDE_BY_SIDE = (REPLICATED, ARCHIVED, WORKERS)  # workloads that compare ours with ours
ALL_KEYS = [*KEYS, *SIDE_BY_SIDE]
# With --quick, a smoke, these run one after the other on one server per column instead
# of a fresh one each: each uses streams of its own, and a start of ours costs more CPU
# than most of them. The idle readers (their memory per waiter is the process's growth,
# which a process that held more before does not show), the restart (it stops its
# server and times the start on its own data) and the many-streams workload keep a
# fresh server.
SHARED_QUICK = frozenset(
    ("appends_64x64", "appends_64x1", "sequential", "catchup_bin", "catchup_json", "live")
)


@dataclass
class Figures:
    workloads: dict[str, dict[str, Result]] = field(default_factory=dict)  # [workload][server]
    ceiling: CeilingResult | None = None
    replicated: dict[str, Result] = field(default_factory=dict)  # "single", "replicated"
    archived: dict[str, Result] = field(default_factory=dict)  # "off", "on"
    workers: dict[str, WorkersResult] = field(default_factory=dict)  # "single", "workers"
    errors: dict[str, str] = field(default_factory=dict)  # "workload/server" -> the error


def one_run(
    w: Workload,
    kind: str,
    prof: Profile,
    workdir: Path,
    baseline: Path | None,
    shared: dict[str, Server],
    runs_by: dict[str, list[Result]],
    errors: dict[str, str],
) -> None:
    """Workload ``w`` once on column ``kind``: on a fresh server, or with --quick, when
    ``w`` is one of SHARED_QUICK, on that column's server in ``shared`` (started by the
    first of them; a failure stops it, so the next starts afresh)."""
    share = prof.quick and w.key in SHARED_QUICK
    found = shared.pop(kind, None) if share else None
    if found is not None:
        srv = found
    elif kind == "reference" and baseline is not None:
        srv = Server("baseline", workdir, source=baseline)
    else:
        srv = Server(kind, workdir)
    log(f"{w.key}: {srv.kind}")
    keep = False
    try:
        disk = disk_syncs_per_s(workdir, 0.25)  # the disk varies over time
        if found is None:
            srv.start()
        elif not srv.running:
            raise RuntimeError(f"{srv.kind} exited after the workload before: {srv.log_tail()}")
        res = w.run(srv, prof)
        res.disk_fdatasync_per_s = disk
        runs_by.setdefault(kind, []).append(res)
        log(f"{w.key}: {srv.kind}: {short(res)}")
        keep = share
    except Exception as exc:
        errors[f"{w.key}/{kind}"] = f"{type(exc).__name__}: {exc}"
        log(f"{w.key}: {srv.kind} FAILED: {exc}")
    finally:
        if keep:
            shared[kind] = srv  # for the next of SHARED_QUICK
        else:
            srv.cleanup()


def run(
    servers: list[str],
    prof: Profile,
    only: list[str],
    workdir: Path,
    repeat: int,
    baseline: Path | None = None,
    workers_count: int = 2,
) -> Figures:
    """Each workload on ours, then the other column (``repeat`` times, alternating).

    The other column is the reference, or with ``baseline`` (the ``server/``
    folder of another checkout) that server; its figures are kept under
    "reference" either way.
    """
    out = Figures()
    if "ceiling" in servers and (not only or CEILING_WORKLOAD in only):
        runs = []
        for _ in range(repeat):
            srv = Server("ceiling", workdir)
            try:
                srv.start()
                log("ceiling: 64 conns x 64 streams")
                runs.append(ceiling_appends(srv, prof))
            except Exception as exc:
                out.errors["ceiling"] = f"{type(exc).__name__}: {exc}"
                log(f"ceiling FAILED: {exc}")
            finally:
                srv.cleanup()
        out.ceiling = merge(runs) if runs else None
    columns = [k for k in ("ours", "reference") if k in servers or (k == "reference" and baseline)]
    shared: dict[str, Server] = {}  # --quick: the server each column's SHARED_QUICK run on
    try:
        for w in WORKLOADS:
            if only and w.key not in only:
                continue
            runs_by: dict[str, list[Result]] = {}
            for _ in range(repeat):
                for kind in columns:
                    if f"{w.key}/{kind}" not in out.errors:
                        one_run(w, kind, prof, workdir, baseline, shared, runs_by, out.errors)
            out.workloads[w.key] = {kind: merge(r) for kind, r in runs_by.items()}
    finally:
        for srv in shared.values():
            srv.cleanup()
    if "ours" in servers and (not only or REPLICATED in only):
        sides, errors = run_replicated(prof, workdir, repeat)
        out.replicated = dict(sides)
        out.errors |= errors
    if "ours" in servers and (not only or ARCHIVED in only):
        archived, errors = run_archived(prof, workdir, repeat)
        out.archived = dict(archived)
        out.errors |= errors
    if "ours" in servers and (not only or WORKERS in only):
        sides, errors = run_workers(prof, workdir, repeat, workers_count)
        out.workers = sides
        out.errors |= errors
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--servers",
        default="ours,reference,ceiling",
        help="comma-separated, from: ours, reference, ceiling (default: all three)",
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of load per wrk workload (default 10; 2 with --quick)",
    )
    ap.add_argument("--quick", action="store_true", help="short smoke profile (CI), < 60 s")
    ap.add_argument(
        "--only", default="", help=f"comma-separated workloads, from: {', '.join(ALL_KEYS)}"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each workload N times, alternating the servers; report medians",
    )
    ap.add_argument(
        "--catchup-append",
        type=int,
        default=None,
        metavar="BYTES",
        help="bytes per append when filling the binary catch-up stream "
        "(default 1024: 1 KiB messages; 16384 with --quick)",
    )
    ap.add_argument(
        "--many-streams",
        type=int,
        default=None,
        metavar="N",
        help="streams of the many-streams workload (default 100000; 2000 with --quick)",
    )
    ap.add_argument(
        "--workers-count",
        type=int,
        default=2,
        metavar="N",
        help="worker processes of the workers workload's multi-process side (default 2)",
    )
    ap.add_argument("--json", dest="json_out", help="also write every figure to this file")
    ap.add_argument(
        "--baseline",
        metavar="REF",
        help="compare with this server at a git ref (before/after) instead of the reference",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    # Every server of ours one process (a replica set's too), as in every table before
    # the default became one per CPU; the workers workload sets its N on its own side.
    os.environ.setdefault("DS_WORKERS", "1")
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [s for s in servers if s not in SERVERS] + [k for k in only if k not in ALL_KEYS]
    if bad:
        ap.error(f"unknown server or workload: {', '.join(bad)}")
    if any(k in only for k in SIDE_BY_SIDE) and "ours" not in servers:
        ap.error("the replicated, archived and workers workloads compare ours with ours: add ours")
    prof = Profile.make(args.quick, args.duration)
    if args.catchup_append:
        prof.catchup_append = args.catchup_append
    if args.many_streams:
        prof.many_streams = args.many_streams

    if args.baseline:  # the baseline runs in the reference's place
        servers = [s for s in servers if s != "reference"]
    selected = [w for w in WORKLOADS if not only or w.key in only]
    uses_wrk = (
        any(w.uses_wrk for w in selected)
        or ("ceiling" in servers and (not only or CEILING_WORKLOAD in only))
        or ("ours" in servers and (not only or any(k in only for k in SIDE_BY_SIDE)))
    )
    if lacking := missing(servers, wrk=uses_wrk):
        for name, why in lacking.items():
            print(f"missing ({name}): {why}", file=sys.stderr)
        print(
            f"{INSTALL_ALL}; or leave a server out with --servers (asked for: {args.servers})",
            file=sys.stderr,
        )
        return 2

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups
    raise_fd_limit()
    other = f"base {args.baseline}" if args.baseline else "reference"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        machine = {
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0],
            "fdatasync_per_s": disk_syncs_per_s(Path(tmp)),
        }
        with baseline_checkout(args.baseline, Path(tmp)) as baseline:
            figures = run(
                servers,
                prof,
                only,
                Path(tmp),
                max(1, args.repeat),
                baseline=baseline,
                workers_count=args.workers_count,
            )
    elapsed = time.monotonic() - started

    rows = build_rows(prof, figures.workloads, figures.ceiling, targets=not args.baseline)
    print(
        f"machine: {machine['cpus']} CPUs, load average {machine['load_average_at_start']:.1f} "
        f"at start, {machine['fdatasync_per_s']:,.0f} fdatasync/s (100-byte appends, one file)"
    )
    if rows or figures.ceiling:
        print(table(rows, figures.ceiling, other))
    for kind, result in figures.workloads.get("many", {}).items():
        if isinstance(result, ManyStreamsResult):
            print(describe("baseline" if args.baseline and kind == "reference" else kind, result))
    replicated_rows = build_replicated_rows(figures.replicated) if figures.replicated else []
    if replicated_rows:
        print(
            f"\nreplicated: {REPLICAS} replicas on this machine (testkit.replicaset), "
            "against single-node ours in the same run"
        )
        print(table(replicated_rows, None, "single-node", "replicated", "repl/single"))
    archived_rows = build_archived_rows(figures.archived) if figures.archived else []
    if archived_rows:
        print("\narchived: ours with the archive on (SeaweedFS on this machine) against off")
        print(table(archived_rows, None, "off", "on", "on/off"))
    workers_rows = build_workers_rows(prof, dict(figures.workers)) if figures.workers else []
    if workers_rows:
        n = args.workers_count
        print(f"\nworkers: ours with --workers {n} against --workers 1, same run")
        print(table(workers_rows, None, "1 worker", f"{n} worker{'s' * (n > 1)}", f"{n}/1"))
        print(describe_model(figures.workers))
    print()
    for key, res in figures.workloads.items():
        for kind, result in res.items():
            label = "baseline" if args.baseline and kind == "reference" else kind
            print(f"  {key} {label}: {short(result)}")
    for side, result in figures.replicated.items():
        print(f"  replicated {side}: {short(result)}")
    for side, result in figures.archived.items():
        print(f"  archived {side}: {short(result)}")
    for side, result in figures.workers.items():
        print(f"  workers {side}: {short(result)}")
    if figures.ceiling:
        print(f"  ceiling: {short(figures.ceiling)}")
    for name, why in figures.errors.items():
        print(f"  ERROR {name}: {why}")
    print(f"  profile: {'quick' if prof.quick else 'full'}, {elapsed:.0f} s")

    if args.json_out:
        ran = servers + (["baseline"] if args.baseline else [])
        doc = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "profile": as_json(prof),
            "long_poll_timeout_s": LONG_POLL_SECONDS,
            "elapsed_s": elapsed,
            "versions": versions(),
            "machine": machine,
            "servers": ran,
            "baseline": args.baseline,
            "errors": figures.errors,
            "ceiling": as_json(figures.ceiling),
            "rows": as_json(rows),
            "replicated_rows": as_json(replicated_rows),
            "archived_rows": as_json(archived_rows),
            "workers_rows": as_json(workers_rows),
            "workers_model": as_json(model(figures.workers["workers"]))
            if "workers" in figures.workers
            else [],
            "raw": as_json(
                figures.workloads
                | {
                    REPLICATED: figures.replicated,
                    ARCHIVED: figures.archived,
                    WORKERS: figures.workers,
                }
            ),
        }
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    return 1 if figures.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
