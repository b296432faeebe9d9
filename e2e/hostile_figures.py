"""The figures behind docs/limits.md: what the hostile requests of issue 11 cost now.

    python e2e/hostile_figures.py

Starts a real server (short deadlines, so that the run takes about a minute),
sends each hostile shape and prints the answer, the time it took and the
server's resident memory after it. The tests assert bounds on the same
things (tests/test_hostile_*.py); this prints the numbers for the docs.
"""

from __future__ import annotations

import http.client
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "server")]

from testkit.servers import Child, free_port, http_status, rss_bytes, stream_server_command  # noqa: E402

MiB = 1024 * 1024
DEADLINE = 3.0  # --header-timeout, --keep-alive-timeout and --body-timeout for this run


def rss_mib(child: Child) -> float:
    assert child.proc is not None
    return rss_bytes(child.proc.pid, children=True) / MiB


def request(port: int, method: str, path: str, body: bytes = b"", **headers: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def seconds_until_closed(sock: socket.socket, trickle: bytes = b"", every: float = 1.0) -> float:
    """Send ``trickle`` a byte per ``every`` seconds until the server closes the socket."""
    started = time.monotonic()
    sock.settimeout(every)
    for i in range(10_000):
        try:
            if sock.recv(65536) == b"":
                break
        except TimeoutError:
            pass
        except OSError:
            break
        if trickle:
            try:
                sock.send(trickle[i % len(trickle) : i % len(trickle) + 1])
            except OSError:
                break
    return time.monotonic() - started


def main() -> None:
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="hostile-")) / "data"
    deadline = str(DEADLINE)
    child = Child(
        "server",
        stream_server_command(
            port,
            data,
            "--header-timeout",
            deadline,
            "--keep-alive-timeout",
            deadline,
            "--body-timeout",
            deadline,
        ),
        log_path=data.parent / "server.log",
    )
    child.start(lambda: http_status(port, "/readyz") == 200)
    rows: list[tuple[str, str, str, str]] = []

    def row(what: str, answer: object, took: float) -> None:
        rows.append((what, str(answer), f"{took:.2f}", f"{rss_mib(child):.0f}"))

    try:
        row("(idle server)", "-", 0.0)
        request(port, "PUT", "/v1/stream/j", b"", **{"content-type": "application/json"})
        for label, body in (
            ("JSON 200 KB [0,0,...] (100,000 elements: the cap)", b"[" + b"0," * 99_999 + b"0]"),
            ("JSON 8 MiB [0,0,...] (4 M elements)", b"[" + b"0," * (4 * MiB - 1) + b"0]"),
            (
                "JSON 8 MiB, 100,000 objects",
                b"[" + b",".join([b'{"k":"' + b"v" * 74 + b'"}'] * 100_000) + b"]",
            ),
            ("JSON 1e400 / NaN / 2000 deep", b"[1e400]"),
        ):
            t = time.monotonic()
            status = request(
                port, "POST", "/v1/stream/j", body, **{"content-type": "application/json"}
            )
            row(label, status, time.monotonic() - t)

        with socket.create_connection(("127.0.0.1", port)) as s:
            t = time.monotonic()
            s.sendall(b"GET /v1/stream/j HTTP/1.1\r\nhost: x\r\nx-big: ")
            sent = 0
            try:
                while sent < 64 * MiB:
                    s.sendall(b"a" * MiB)
                    sent += MiB
            except OSError:
                pass
            s.settimeout(5)
            try:
                answer = s.recv(100).split(b"\r\n")[0].decode()
            except OSError as exc:
                answer = type(exc).__name__
            row(
                f"endless header ({sent // MiB} MiB sent)",
                answer,
                time.monotonic() - t,
            )

        for label, head, trickle in (
            ("idle connection", b"", b""),
            ("partial head, then silence", b"GET / HTTP/1.1\r\nhost: x\r\n", b""),
            ("head trickled a byte per second", b"GET / HTTP/1.1\r\n", b"x-a: b\r\n"),
            (
                "32 MiB body trickled a byte per second",
                b"POST /v1/stream/j HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 33554432\r\n\r\n[",
                b"0,",
            ),
        ):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(head)
                row(f"{label}: closed after (s)", "closed", seconds_until_closed(s, trickle))

        long_path = "/v1/stream/" + "p" * 600
        t = time.monotonic()
        row(
            "path of 611 bytes (LMDB keys <= 511)",
            request(port, "PUT", long_path),
            time.monotonic() - t,
        )
        t = time.monotonic()
        producer = {"producer-id": "p" * 600, "producer-epoch": "0", "producer-seq": "0"}
        status = request(
            port, "POST", "/v1/stream/j", b"1", **{"content-type": "application/json"}, **producer
        )
        row("Producer-Id of 600 bytes", status, time.monotonic() - t)
        t = time.monotonic()
        row("PUT /v1/stre%61m/b/x", request(port, "PUT", "/v1/stre%61m/b/x"), time.monotonic() - t)
    finally:
        child.stop()

    print(f"server with --header-timeout/--keep-alive-timeout/--body-timeout {DEADLINE:g}")
    print("| request | answer | seconds | RSS after, server and its JSON worker (MiB) |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
