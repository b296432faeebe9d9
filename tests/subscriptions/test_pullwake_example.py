"""examples/pullwake_worker.py against a real server, as a user would run it: two worker
processes sharing one pull-wake subscription (the rest of pull-wake: test_pullwake.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subscriptions._api import Api, offset, pull, until

pytestmark = pytest.mark.processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pullwake_worker.py"


def test_the_example_worker_pool_processes_everything(server_factory, tmp_path):
    """examples/pullwake_worker.py, two of them, as a user would run them."""
    srv = server_factory().start()
    api = Api(srv.base)
    api.stream("wake/pool", b"[]")
    api.put("pool", pull(lease=5000))
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--base",
                srv.base,
                "--subscription",
                "pool",
                "--name",
                f"w{i}",
            ],
            stdout=open(tmp_path / f"w{i}.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        for i in (1, 2)
    ]
    try:
        sent = set()
        for n in range(12):
            path = f"events/s{n % 4}"
            if n < 4:
                api.stream(path)
            api.append(path, json.dumps({"n": n}).encode())
            sent.add(f'{path}: {{"n": {n}}}')

        def printed() -> set[str]:
            lines = []
            for i in (1, 2):
                lines += (tmp_path / f"w{i}.log").read_text().splitlines()
            return {line.split(": ", 1)[1] for line in lines if ': {"n"' in line}

        until(lambda: printed() >= sent)
        until(lambda: api.acked("pool") == {f"events/s{i}": offset(3) for i in range(4)})
    finally:
        for w in workers:
            w.terminate()
            w.wait()
