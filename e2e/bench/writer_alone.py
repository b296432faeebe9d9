"""The writer alone: how many appends per second the serial part of ``--workers N``
carries when nothing else limits it (issue 28: "a writer whose serial cost allows at
least 4x on 8 cores", measured rather than modelled).

A client in this process opens ``LINKS`` extra links to a running writer, as that
many more workers would, and keeps ``IN_FLIGHT`` appends of 100 bytes in flight on
each over the 64 x 64 run's streams, speaking the workers' own link protocol
(``stream_server.workers.link``): each frame of answers is followed by one frame of as
many new appends. The client does no HTTP and little else, so the writer is the
bound: its appends/s, beside the single process's 64 x 64 appends/s, is how far
cores can take the design before the writer's core is full. Both are measured on
this machine, the writer here sharing two cores with its client.

256 appends in flight, four times the 64 x 64 run's: what a pod serving four times
the appends holds at the same latency. With 64 (8 links x 8) the writer is not full
but waits on its flushes (by Little's law, at most 64 appends per commit round trip,
whatever the CPU), which measures the disk, not the serial part.

What the writer holds afterwards is checked against what it acknowledged, as the
HTTP workloads check theirs.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

from stream_server.workers.link import HEADER, PROTOCOL

LINKS = 8  # as many links as an 8-core pod's workers
IN_FLIGHT = 32  # appends in flight on each
BODY = b"x" * 100
BIN = "application/octet-stream"


@dataclass(frozen=True)
class Fed:
    acknowledged: int
    refused: int
    seconds: float


def link_socket(writer_pid: int, tmp: Path) -> Path:
    """The writer's link socket, in its runtime directory (``workers/processes.py``)."""
    found = sorted(tmp.glob(f"ds-writer-{writer_pid}-*/link.sock"))
    if not found:
        raise RuntimeError(f"no link socket of writer pid {writer_pid} in {tmp}")
    return found[-1]


def feed(sock: Path, paths: list[str], seconds: float) -> Fed:
    """``LINKS`` links, ``IN_FLIGHT`` appends in flight on each, for ``seconds``."""
    return asyncio.run(_feed(sock, paths, seconds))


async def _feed(sock: Path, paths: list[str], seconds: float) -> Fed:
    counts = {"ok": 0, "refused": 0}
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    await asyncio.gather(*(_one_link(sock, paths, k, deadline, counts) for k in range(LINKS)))
    return Fed(counts["ok"], counts["refused"], time.monotonic() - started)


async def _one_link(
    sock: Path, paths: list[str], k: int, deadline: float, counts: dict[str, int]
) -> None:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    rid = 0

    def frame(n: int) -> bytes:
        nonlocal rid
        messages = []
        for _ in range(n):
            rid += 1
            path = paths[(rid * LINKS + k) % len(paths)]
            messages.append((rid, "append", (path, BIN, BODY, None, None, False, None)))
        data = pickle.dumps(messages, PROTOCOL)
        return HEADER.pack(len(data)) + data

    writer.write(frame(IN_FLIGHT))
    in_flight = IN_FLIGHT
    try:
        while in_flight:
            (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
            answers = pickle.loads(await reader.readexactly(size))
            in_flight -= len(answers)
            for _, ok, _ in answers:
                counts["ok" if ok else "refused"] += 1
            if time.monotonic() < deadline:
                writer.write(frame(len(answers)))
                in_flight += len(answers)
    finally:
        writer.close()
