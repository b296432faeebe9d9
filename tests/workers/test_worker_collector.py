"""A worker sets the collector as the writer does: the server's thresholds, and what its
start built frozen (``serving.GC_THRESHOLDS``). With CPython's defaults a full
collection walks every object the worker holds (its connections, its live readers)
while its event loop stands still. ``serve_worker`` runs here up to the point where it
would serve."""

from __future__ import annotations

import argparse
import gc
import socket
from pathlib import Path

from stream_server.config import add_arguments, settings_from
from stream_server.serving import GC_THRESHOLDS, StreamServer
from stream_server.workers import processes
from stream_server.workers.supervisor import Sockets, worker_env


def test_a_worker_takes_the_servers_thresholds_and_freezes_its_start(tmp_path: Path, monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = settings_from(parser.parse_args(["--data-dir", str(tmp_path / "d")]), {})
    listening = socket.create_server(("127.0.0.1", 0))
    sockets = Sockets(link=tmp_path / "link.sock", http=tmp_path / "http.sock", metrics=None)
    for name, value in worker_env(settings, listening, sockets).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(processes, "configure", lambda *_: None)  # the tests' logging stays
    seen: dict[str, object] = {}

    def run(self: StreamServer, sockets: list[socket.socket]) -> None:
        seen["thresholds"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        for s in sockets:
            s.detach()  # the listening socket is closed below, once

    monkeypatch.setattr(StreamServer, "run", run)
    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)  # CPython's defaults, as a new worker process starts
    try:
        processes.serve_worker()
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        listening.close()
    assert seen["thresholds"] == GC_THRESHOLDS
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 0
