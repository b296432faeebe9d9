"""Side-by-side benchmark: our server, the Node reference server, and the HTTP ceiling.

    python e2e/bench/run.py            # full profile (a few minutes)
    python e2e/bench/run.py --quick    # smoke profile (well under a minute)

Every server runs on this machine in its own temporary data directory and
with the same long-poll timeout; the load comes from wrk (appends) and from
lean asyncio clients (reads and live reads, which wrk cannot chain). Both
servers fsync before acknowledging: no workload weakens durability. The
table gives each workload, both figures, ours/reference, the target and
whether it is met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LONG_POLL_SECONDS = 20
BIN = {"Content-Type": "application/octet-stream", "Accept-Encoding": "identity"}
JSON_CT = {"Content-Type": "application/json", "Accept-Encoding": "identity"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Server:
    name: str
    port: int = field(default_factory=free_port)
    data_dir: Path | None = None
    proc: subprocess.Popen | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stream(self, path: str) -> str:
        return f"{self.url}/v1/stream/{path}"

    def command(self) -> list[str]:
        assert self.data_dir is not None
        if self.name == "ours":
            return [
                sys.executable,
                "-m",
                "stream_server",
                "serve",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                "--long-poll-timeout",
                str(LONG_POLL_SECONDS),
                "--log-level",
                "warning",
                "--max-live-readers",
                "100000",
            ]
        if self.name == "reference":
            return [
                "node",
                str(HERE / "reference_server.mjs"),
                str(self.port),
                str(self.data_dir),
                str(LONG_POLL_SECONDS * 1000),
            ]
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "ceiling_app:app",
            "--port",
            str(self.port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--no-access-log",
            "--log-level",
            "warning",
        ]

    def start(self, data_dir: Path | None = None) -> Server:
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(HERE)},
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited: {self.proc.stderr.read().decode()[-2000:]}"
                )
            try:
                if self.name == "ours":
                    ok = httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
                else:
                    ok = httpx.head(self.stream("__bench_probe"), timeout=2).status_code in (
                        404,
                        405,
                        204,
                    )
                if ok:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} not ready")

    def ready_seconds(self) -> float:
        return time.monotonic() - self.started_at

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# --------------------------------------------------------------------- wrk

WRK_APPEND = """
local counter = 0
local body = string.rep("x", {size})
setup = function(thread) thread:set("id", counter); counter = counter + 1 end
init = function(args) n = 0 end
request = function()
  n = n + 1
  local s = {pick}
  return wrk.format("POST", "/v1/stream/{prefix}" .. s, {{["Content-Type"]="application/octet-stream"}}, body)
end
done = function(summary, latency, requests)
  io.write(string.format("JSON{{\\"requests\\":%d,\\"errors\\":%d,\\"status\\":%d,\\"p50\\":%d,\\"p99\\":%d,\\"seconds\\":%f}}\\n",
    summary.requests, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99), summary.duration / 1e6))
end
"""


def wrk(
    url: str,
    *,
    connections: int,
    threads: int,
    seconds: float,
    streams: int,
    prefix: str,
    size: int = 100,
) -> dict:
    pick = "0" if streams == 1 else f"(id * 7919 + n) % {streams}"
    script = WRK_APPEND.format(size=size, pick=pick, prefix=prefix)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
    try:
        out = subprocess.run(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds}s",
                "--latency",
                "-s",
                fh.name,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
        ).stdout
    finally:
        os.unlink(fh.name)
    stats = json.loads(re.search(r"JSON(\{.*\})", out).group(1))
    stats["rps"] = stats["requests"] / stats["seconds"]
    return stats


def create_streams(srv: Server, prefix: str, n: int, headers=BIN) -> None:
    with httpx.Client(timeout=30) as c:
        for i in range(n):
            r = c.put(srv.stream(f"{prefix}{i}"), headers=headers)
            assert r.status_code in (200, 201), r.text


# ---------------------------------------------------------------- workloads


def appends(srv: Server, *, streams: int, seconds: float) -> dict:
    prefix = f"w{streams}-"
    create_streams(srv, prefix, streams)
    st = wrk(srv.url, connections=64, threads=2, seconds=seconds, streams=streams, prefix=prefix)
    ok = st["requests"] - st["status"] - st["errors"]
    return {"value": ok / st["seconds"], "unit": "appends/s", "errors": st["errors"] + st["status"]}


def sequential(srv: Server, *, seconds: float) -> dict:
    create_streams(srv, "seq-", 1)
    st = wrk(srv.url, connections=1, threads=1, seconds=seconds, streams=1, prefix="seq-")
    return {"value": st["p50"] / 1000.0, "unit": "ms p50", "p99_ms": st["p99"] / 1000.0}


def catch_up(srv: Server, *, mib: int, json_mode: bool) -> dict:
    """Write ``mib`` MiB of 1 KiB messages, then time one reader catching up from -1."""
    path = f"catchup-{'json' if json_mode else 'bin'}"
    url = srv.stream(path)
    with httpx.Client(timeout=120) as c:
        c.put(url, headers=JSON_CT if json_mode else BIN)
        if json_mode:
            msg = json.dumps({"pad": "x" * 1010})  # 1 KiB per message
            batch = ("[" + ",".join([msg] * 1024) + "]").encode()
            for _ in range(mib):
                assert c.post(url, headers=JSON_CT, content=batch).status_code in (200, 204)
        else:
            chunk = b"x" * (64 * 1024)  # appends of 64 messages of 1 KiB
            for _ in range(mib * 16):
                assert c.post(url, headers=BIN, content=chunk).status_code in (200, 204)
    return asyncio.run(_read_all(url))


async def _read_all(url: str) -> dict:
    best = 0.0
    total = 0
    async with httpx.AsyncClient(timeout=120) as c:
        for _ in range(2):  # the better of two runs: the first also warms the page cache
            started = time.perf_counter()
            total, offset, requests = 0, "-1", 0
            while True:
                r = await c.get(
                    url, params={"offset": offset}, headers={"Accept-Encoding": "identity"}
                )
                total += len(r.content)
                requests += 1
                offset = r.headers["stream-next-offset"]
                if r.headers.get("stream-up-to-date") == "true":
                    break
            best = max(best, total / 2**20 / (time.perf_counter() - started))
    return {"value": best, "unit": "MiB/s", "bytes": total, "requests": requests}


def live_latency(srv: Server, *, rounds: int) -> dict:
    create_streams(srv, "live-", 1)
    return asyncio.run(_live(srv.stream("live-0"), rounds))


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif status not in (204, 304):
        await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers


async def _live(url: str, rounds: int) -> dict:
    """Raw keep-alive sockets for the reader and the writer: the figure is the servers'."""
    port = int(url.split(":")[2].split("/")[0])
    path = "/" + url.split("/", 3)[3]
    rr, rw = await asyncio.open_connection("127.0.0.1", port)
    wr, ww = await asyncio.open_connection("127.0.0.1", port)
    rw.write(f"HEAD {path} HTTP/1.1\r\nHost: b\r\n\r\n".encode())
    head = await rr.readuntil(b"\r\n\r\n")
    offset = re.search(rb"(?i)stream-next-offset: *(\S+)", head).group(1).decode()
    lat = []
    post = (
        f"POST {path} HTTP/1.1\r\nHost: b\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: 100\r\n\r\n"
    ).encode() + b"y" * 100
    for _ in range(rounds):
        rw.write(f"GET {path}?offset={offset}&live=long-poll HTTP/1.1\r\nHost: b\r\n\r\n".encode())
        await asyncio.sleep(0.005)  # let the reader reach the server and wait
        sent = time.perf_counter()
        ww.write(post)
        status, headers = await _read_response(rr)
        lat.append((time.perf_counter() - sent) * 1000)
        assert status == 200, status
        offset = headers["stream-next-offset"]
        await _read_response(wr)
    for w in (rw, ww):
        w.close()
    lat.sort()
    return {
        "value": statistics.median(lat),
        "unit": "ms p50",
        "p99_ms": lat[int(len(lat) * 0.99) - 1],
    }


def idle_readers(srv: Server, *, readers: int, streams: int) -> dict:
    create_streams(srv, "idle-", streams)
    return asyncio.run(_idle(srv, readers, streams))


async def _idle(srv: Server, readers: int, streams: int) -> dict:
    """Raw sockets: a client library's per-response cost would swamp the wake latency."""
    wake: dict[int, float] = {}
    sent: dict[int, float] = {}
    statuses: dict[int, bytes] = {}
    rss_before = rss_bytes(srv.proc.pid)
    conns = []
    for i in range(readers):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(
            f"GET /v1/stream/idle-{i % streams}?offset=now&live=long-poll HTTP/1.1\r\n"
            f"Host: bench\r\n\r\n".encode()
        )
        conns.append((reader, writer))

    async def wait(i: int) -> None:
        line = await conns[i][0].readline()
        wake[i] = time.perf_counter()
        statuses[i] = line.split(b" ")[1] if line else b"0"

    tasks = [asyncio.create_task(wait(i)) for i in range(readers)]
    await asyncio.sleep(max(2.0, readers / 250))  # all connected and waiting
    rss_idle = rss_bytes(srv.proc.pid)
    writers = []
    for _ in range(streams):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writers.append((reader, writer))
    for s, (_, writer) in enumerate(writers):
        sent[s] = time.perf_counter()
        writer.write(
            f"POST /v1/stream/idle-{s} HTTP/1.1\r\nHost: bench\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: 1\r\n\r\nz".encode()
        )
    await asyncio.wait_for(asyncio.gather(*tasks), LONG_POLL_SECONDS + 30)
    for _, writer in conns + writers:
        writer.close()
    lat = sorted((wake[i] - sent[i % streams]) * 1000 for i in range(readers))
    woken = sum(1 for code in statuses.values() if code == b"200")
    return {
        "value": lat[int(len(lat) * 0.99) - 1],
        "unit": "ms p99",
        "woken": woken,
        "readers": readers,
        "bytes_per_waiter": max(0, rss_idle - rss_before) / readers,
    }


def restart(srv: Server, *, streams: int, mib: int) -> dict:
    """Fill ``streams`` streams with ``mib`` MiB in all, stop, start again: seconds to ready."""
    size = max(1, mib * 2**20 // streams)
    body = b"r" * size
    asyncio.run(_fill(srv, streams, body))
    srv.stop()
    srv.start(srv.data_dir)
    seconds = srv.ready_seconds()
    return {
        "value": seconds,
        "unit": "s to ready",
        "rss_mib": rss_bytes(srv.proc.pid) / 2**20,
        "streams": streams,
        "mib": mib,
    }


async def _fill(srv: Server, streams: int, body: bytes) -> None:
    sem = asyncio.Semaphore(64)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as c:

        async def one(i: int) -> None:
            async with sem:
                r = await c.put(srv.stream(f"many/{i}"), headers=BIN, content=body)
                assert r.status_code in (200, 201), r.status_code

        await asyncio.gather(*(one(i) for i in range(streams)))


# ------------------------------------------------------------------- driver


@dataclass
class Workload:
    key: str
    title: str
    run: object
    better: str  # "higher" or "lower"
    target: str
    check: object  # (ours, ref, ceiling) -> bool | None
    reference: bool = True


def profile(quick: bool) -> list[Workload]:
    secs = 3 if quick else 10
    mib = 8 if quick else 100
    many = (2000, 20) if quick else (100_000, 1024)
    idle = (200, 20) if quick else (1000, 100)
    return [
        Workload(
            "appends_64x64",
            "64 conns, 64 streams (appends/s)",
            lambda s: appends(s, streams=64, seconds=secs),
            "higher",
            ">= 7x ref and >= 60% ceiling",
            lambda o, r, c: None if r is None else o >= 7 * r and (c is None or o >= 0.6 * c),
        ),
        Workload(
            "appends_64x1",
            "64 conns, 1 stream (appends/s)",
            lambda s: appends(s, streams=1, seconds=secs),
            "higher",
            ">= 15x ref",
            lambda o, r, c: None if r is None else o >= 15 * r,
        ),
        Workload(
            "sequential",
            "1 client sequential (p50 ms)",
            lambda s: sequential(s, seconds=secs),
            "lower",
            "<= 0.5x ref",
            lambda o, r, c: None if r is None else o <= 0.5 * r,
        ),
        Workload(
            "catchup_bin",
            f"catch-up {mib} MiB binary (MiB/s)",
            lambda s: catch_up(s, mib=mib, json_mode=False),
            "higher",
            ">= 6x ref",
            lambda o, r, c: None if r is None else o >= 6 * r,
        ),
        Workload(
            "catchup_json",
            f"catch-up {mib} MiB JSON (MiB/s)",
            lambda s: catch_up(s, mib=mib, json_mode=True),
            "higher",
            ">= 6x ref",
            lambda o, r, c: None if r is None else o >= 6 * r,
        ),
        Workload(
            "live",
            "live long-poll POST->reader (p50 ms)",
            lambda s: live_latency(s, rounds=50 if quick else 300),
            "lower",
            "<= 0.5x ref",
            lambda o, r, c: None if r is None else o <= 0.5 * r,
        ),
        Workload(
            "idle_readers",
            f"{idle[0]} idle long-polls / {idle[1]} streams (wake p99 ms)",
            lambda s: idle_readers(s, readers=idle[0], streams=idle[1]),
            "lower",
            "all woken, p99 <= 50 ms",
            lambda o, r, c: o <= 50,
        ),
        Workload(
            "restart",
            f"{many[0]} streams / {many[1]} MiB restart (s to ready)",
            lambda s: restart(s, streams=many[0], mib=many[1]),
            "lower",
            "<= 10 s",
            lambda o, r, c: o <= 10,
            reference=False,
        ),
    ]


def run(servers: list[str], quick: bool, only: set[str] | None) -> list[dict]:
    ceiling = None
    if "ceiling" in servers:
        srv = Server("ceiling").start()
        try:
            ceiling = wrk(
                srv.url,
                connections=64,
                threads=2,
                seconds=3 if quick else 10,
                streams=64,
                prefix="c",
            )["rps"]
        finally:
            srv.cleanup()
    rows = []
    for w in profile(quick):
        if only and w.key not in only:
            continue
        results = {}
        for name in ("ours", "reference"):
            if name not in servers or (name == "reference" and not w.reference):
                continue
            srv = Server(name).start()
            try:
                results[name] = w.run(srv)
            finally:
                srv.cleanup()
        ours = results.get("ours", {}).get("value")
        ref = results.get("reference", {}).get("value")
        ratio = ours / ref if ours is not None and ref else None
        met = (
            w.check(ours, ref, ceiling if w.key == "appends_64x64" else None)
            if ours is not None
            else None
        )
        rows.append(
            {
                "workload": w.key,
                "title": w.title,
                "ours": results.get("ours"),
                "reference": results.get("reference"),
                "ratio": ratio,
                "target": w.target,
                "met": met,
            }
        )
    return [
        {
            "workload": "ceiling",
            "title": "Starlette POST->204 ceiling (req/s)",
            "ours": {"value": ceiling} if ceiling else None,
            "reference": None,
            "ratio": None,
            "target": "",
            "met": None,
        },
        *rows,
    ]


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def table(rows: list[dict]) -> str:
    lines = [
        f"| {'workload':46} | {'ours':>10} | {'reference':>10} | {'ours/ref':>8} | {'target':28} | met |",
        f"|{'-' * 48}|{'-' * 12}|{'-' * 12}|{'-' * 10}|{'-' * 30}|-----|",
    ]
    for r in rows:
        ours = (r["ours"] or {}).get("value")
        ref = (r["reference"] or {}).get("value")
        ratio = f"{r['ratio']:.1f}x" if r["ratio"] else "-"
        met = {True: "yes", False: "NO", None: ""}[r["met"]]
        lines.append(
            f"| {r['title']:46} | {fmt(ours):>10} | {fmt(ref):>10} | {ratio:>8} | {r['target']:28} | {met:3} |"
        )
    return "\n".join(lines)


def ensure_tools(servers: list[str]) -> None:
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk; `make system-deps` does it)")
    if (
        "reference" in servers
        and not (HERE / "node_modules" / "@durable-streams" / "server").exists()
    ):
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="short smoke profile")
    ap.add_argument("--servers", default="ours,reference,ceiling")
    ap.add_argument("--only", default="", help="comma-separated workload keys")
    ap.add_argument("--json", dest="json_out", help="write the raw results here")
    args = ap.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    ensure_tools(servers)
    rows = run(servers, args.quick, set(filter(None, args.only.split(","))) or None)
    print(table(rows))
    for r in rows:
        extra = {k: v for k, v in (r["ours"] or {}).items() if k not in ("value", "unit")}
        if extra:
            print(f"  {r['workload']} ours: {extra}")
        extra = {k: v for k, v in (r["reference"] or {}).items() if k not in ("value", "unit")}
        if extra:
            print(f"  {r['workload']} reference: {extra}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
