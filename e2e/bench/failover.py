"""Failover time of a 3-replica set, at the default lease and at short ones.

For each lease setting (``DURATION,RENEW,RETRY`` seconds) and round: a set is
started (``testkit.replicaset``), one writer appends to the primary without
pause (following ``Stream-Primary`` and retrying the 503s that say nothing
was written), the primary is killed with SIGKILL, and the script prints how
long after the kill a new primary was seen (``GET /replication``) and its
first append acknowledged, and whether every append acknowledged before the
kill reads back exactly once from the new primary.

    .venv/bin/python e2e/bench/failover.py --rounds 3 --lease 15,10,2 --lease 3,2,0.3
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testkit.replicaset import ReplicaSet

TEXT = {"content-type": "text/plain"}


class Writer(threading.Thread):
    """Appends ``w-N;`` one after another to whichever server is primary."""

    def __init__(self, rs: ReplicaSet, path: str) -> None:
        super().__init__(daemon=True)
        self.rs, self.path = rs, path
        self.acked: list[tuple[float, bytes, str]] = []  # when, body, by whom (url)
        self.stop = threading.Event()

    def run(self) -> None:
        url = self.rs.primary().url
        i = 0
        with httpx.Client(timeout=5) as http:
            while not self.stop.is_set():
                body = f"w-{i};".encode()
                try:
                    r = http.post(f"{url}/v1/stream/{self.path}", content=body, headers=TEXT)
                except httpx.HTTPError:
                    url = self._another(url)
                    continue
                if r.status_code == 204:
                    self.acked.append((time.monotonic(), body, url))
                    i += 1
                elif r.status_code == 503 and "stream-primary" in r.headers:
                    url = r.headers["stream-primary"]
                else:  # unknown outcome or not yet a primary: a new body, never a retry
                    i += 1
                    time.sleep(0.02)

    def _another(self, url: str) -> str:
        time.sleep(0.05)
        others = [s.url for s in self.rs.servers if s.url != url and self.rs.alive(s.name)]
        return others[int(time.monotonic() * 10) % len(others)] if others else url


def one_round(root: Path, lease: tuple[str, str, str]) -> str:
    duration, renew, retry = lease
    settings = {
        "lease_duration": duration,
        "lease_renew_deadline": renew,
        "lease_retry_period": retry,
    }
    rs = ReplicaSet.up(3, root, settings=settings)
    try:
        primary = rs.primary()
        deadline = time.monotonic() + 60
        while len((rs.status(primary.name) or {}).get("in_sync", [])) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"standbys never in sync: {rs.statuses()}")
            time.sleep(0.1)
        assert httpx.put(f"{primary.url}/v1/stream/f", headers=TEXT).status_code == 201
        writer = Writer(rs, "f")
        writer.start()
        time.sleep(2.0)  # writes under way before the kill
        rs.kill(primary.name, signal.SIGKILL)
        killed = time.monotonic()
        before = [body for t, body, _ in writer.acked if t <= killed]
        new = rs.primary(exclude=(primary.name,), timeout=120)
        seen = time.monotonic() - killed
        deadline = time.monotonic() + 120
        while not any(t > killed and by == new.url for t, _, by in writer.acked):
            if time.monotonic() > deadline:
                raise RuntimeError("the new primary acknowledged nothing within 120 s")
            time.sleep(0.02)
        first = min(t for t, _, by in writer.acked if t > killed and by == new.url) - killed
        writer.stop.set()
        writer.join()
        content = httpx.get(f"{new.url}/v1/stream/f?offset=-1", timeout=30).content
        lost = sum(1 for body in before if content.count(body) != 1)
        return (
            f"lease {duration}/{renew}/{retry} s: new primary seen after {seen:.2f} s, "
            f"first append acknowledged by it after {first:.2f} s; "
            f"{len(before)} acknowledged before the kill, {lost} lost"
        )
    finally:
        rs.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lease", action="append", default=[], help="DURATION,RENEW,RETRY")
    args = parser.parse_args()
    leases = [tuple(x.split(",")) for x in args.lease or ["15,10,2", "3,2,0.3"]]
    for lease in leases:
        for n in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
                print(f"round {n + 1}: {one_round(Path(tmp), lease)}", flush=True)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
