"""The programs a user runs beside the server, each run as its own process: the example
pull-wake worker (two of them sharing a subscription, against a server process), the
example webhook receiver (verifying our signatures), and ``rotate-webhook-key``.
The rest of the subscriptions is tested in-process (test_pullwake.py, test_endpoints.py)
or without a server (test_webhook_sender.py, test_signing.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from stream_server.subscriptions.signing import WebhookKeys
from stream_server.subscriptions.urls import WebhookAllowList
from stream_server.subscriptions.webhook_sender import WebhookSender
from tests.subscriptions._api import Api, offset, pull, until

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "examples" / "pullwake_worker.py"
EXAMPLE = ROOT / "examples" / "webhook_receiver.py"
NONE = WebhookAllowList.from_settings([])
BODY = json.dumps({"subscription_id": "sub-1", "wake_id": "w_1", "generation": 1}).encode()


@pytest.fixture
def keys(tmp_path) -> WebhookKeys:
    return WebhookKeys.load_or_create(tmp_path / "webhook-keys")


def kids(jwks: dict) -> list[str]:
    return [k["kid"] for k in jwks["keys"]]


# -- the example pull-wake worker ------------------------------------------------------


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
                str(WORKER),
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


# -- the example receiver, run as its own process ------------------------------------


@contextlib.contextmanager
def serving_jwks(keys: WebhookKeys) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(keys.jwks()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/jwk-set+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/stream/__ds/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def example_receiver(jwks_url: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE),
            "--jwks-url",
            jwks_url,
            "--port",
            "0",
            "--refetch-every",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.stderr.read() if proc.stderr else "")
        yield line.split()[-1].rstrip("/"), proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_the_example_receiver_verifies_our_signatures_and_says_done(keys):
    with serving_jwks(keys) as jwks_url, example_receiver(jwks_url) as (url, proc):
        assert proc.stdout is not None
        sender = WebhookSender(keys, NONE, timeout=10)
        try:
            d = await sender.send(f"{url}/hook", BODY)
            assert d.ok and d.json == {"done": True}, d
            assert json.loads(proc.stdout.readline()) == json.loads(BODY)

            async with httpx.AsyncClient() as raw:
                # One second on from the sender's signature: Ed25519 is deterministic, and
                # the same body and second would be the same signature, a replay.
                good = keys.sign(BODY, now=int(time.time()) + 1)
                altered = BODY.replace(b"w_1", b"w_2")
                for body, header, status in [
                    (altered, good, 401),  # altered body
                    (BODY, good.replace("ed25519=", "ed25519=A"), 401),  # broken signature
                    (BODY, keys.sign(BODY, now=int(good[2:12]) - 3600), 401),  # stale
                    (BODY, None, 401),  # unsigned
                ]:
                    headers = {"Webhook-Signature": header} if header else {}
                    resp = await raw.post(f"{url}/hook", content=body, headers=headers)
                    assert resp.status_code == status, (resp.status_code, resp.text)
                first = await raw.post(
                    f"{url}/hook", content=BODY, headers={"Webhook-Signature": good}
                )
                assert first.status_code == 200
                assert json.loads(proc.stdout.readline()) == json.loads(BODY)
                replay = await raw.post(
                    f"{url}/hook", content=BODY, headers={"Webhook-Signature": good}
                )
                assert replay.status_code == 409

            # After a rotation the receiver meets an unknown kid, refetches the JWKS, accepts.
            keys.rotate()
            d = await sender.send(f"{url}/hook", BODY)
            assert d.ok and d.json == {"done": True}, d
        finally:
            await sender.aclose()


# -- rotate-webhook-key ------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DS_")}
    return subprocess.run(
        [sys.executable, "-m", "stream_server", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_rotate_command_rotates_the_ring_in_the_data_directory(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    before = WebhookKeys.load_or_create(data / "webhook-keys")
    proc = run_cli("rotate-webhook-key", "--data-dir", str(data))
    assert proc.returncode == 0, proc.stderr
    after = WebhookKeys.load_or_create(data / "webhook-keys")
    assert after.kid != before.kid and after.kid in proc.stdout and before.kid in proc.stdout
    assert kids(after.jwks()) == [after.kid, before.kid]


def test_the_rotate_command_refuses_a_missing_data_directory(tmp_path: Path):
    proc = run_cli("rotate-webhook-key", "--data-dir", str(tmp_path / "typo"))
    assert proc.returncode == 1 and "no data directory" in proc.stderr
    assert not (tmp_path / "typo").exists()
