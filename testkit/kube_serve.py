"""The emulated Kubernetes API server (``testkit.kube.ApiServer``) as a process of its own.

``testkit.cluster`` runs the emulator in a thread of the test process, which is
right for the operator tests. A replica set on one machine (``testkit.replicaset``)
needs it to outlive the command that started it and to be killable on its own,
like the real kube-apiserver: so here it is a program.

    python -m testkit.kube_serve --port 4500 [--url-file F]

It serves until SIGTERM or SIGINT. ``--url-file`` receives its URL once it
listens (``--port 0``: any free port), so that a starter knows where it is
without parsing logs. Leases (``coordination.k8s.io/v1``) are among the
bundled resources: no CRD is needed for replication.

``api_server_process`` starts it so for a test, with the CRD installed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import kmock

from testkit import wait_for
from testkit.cluster import Cluster
from testkit.kube import BACKUP_CRD_FILE, CRD_FILE, ApiServer, storage_class

ROOT = Path(__file__).resolve().parent.parent


async def serve(host: str, port: int, url_file: Path | None) -> None:
    """Serve one ApiServer on ``host:port`` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api = ApiServer()
    async with api, kmock.Server(api, host=host, port=port or None) as server:
        url = str(server.url).rstrip("/")
        print(f"emulated Kubernetes API at {url}", flush=True)
        if url_file is not None:
            tmp = url_file.with_name(url_file.name + ".tmp")
            tmp.write_text(url + "\n")
            tmp.replace(url_file)  # whole or absent: a reader never sees half a URL
        await stop.wait()


@contextmanager
def api_server_process(where: Path) -> Iterator[Cluster]:
    """The emulated API server as a process of its own (its URL file and log in ``where``),
    with the DurableStream CRD and a default StorageClass, as the real one is: in the test's
    process it would share the interpreter with kopf, the kubelet stand-in and the
    writers, and answer the servers' Lease renewals late enough under that load to make a
    healthy primary step down at its renew deadline."""
    url_file = where / "kube-api.url"
    with open(where / "kube-api.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "testkit.kube_serve", "--url-file", str(url_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    c = Cluster()
    try:
        c.url = wait_for(
            lambda: url_file.read_text().strip() if url_file.exists() else None,
            timeout=30,
            message="the emulated API server's URL",
        )
        c.http = httpx.Client(base_url=c.url, timeout=10)
        c.install_crd_file(CRD_FILE)
        c.install_crd_file(BACKUP_CRD_FILE)
        c.create(storage_class("standard", expandable=True, default=True)).raise_for_status()
        yield c
    finally:
        if c.http is not None:
            c.http.close()
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.kube_serve",
        description="Serve the emulated Kubernetes API server until SIGTERM.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--url-file", type=Path, help="write the URL here once listening")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.url_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
