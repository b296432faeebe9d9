"""Fault injection for tests, from the ``DS_FAULT`` environment variable.

``DS_FAULT=crash:<stage>:<n>`` ends the process (exit 137, no cleanup, as a
``kill -9`` would) the n-th time a batch reaches ``<stage>``;
``DS_FAULT=eio:fsync:<n>`` makes the n-th WAL flush fail with EIO. Stages, in
order: ``segments`` (records written, WAL not yet), ``fsync`` (frame written,
not flushed), ``wal`` (flushed, LMDB not committed), ``commit`` (committed,
not acknowledged), ``punch`` (a retention drop committed, its blocks not yet
punched). Never set in production: the server logs loudly if it is.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable

log = logging.getLogger("stream_server.faults")

STAGES = ("segments", "fsync", "wal", "commit", "punch")


def hook_from_env(value: str | None) -> Callable[[str], None] | None:
    if not value:
        return None
    try:
        action, stage, nth = value.split(":")
        count = int(nth)
    except ValueError:
        raise ValueError(f"DS_FAULT must be action:stage:n, not {value!r}") from None
    if action not in ("crash", "eio") or stage not in STAGES or count < 1:
        raise ValueError(f"unsupported DS_FAULT {value!r}")
    log.warning("fault injection armed: %s", value)
    seen = {"n": 0}

    def hook(at: str) -> None:
        if at != stage:
            return
        seen["n"] += 1
        if seen["n"] != count:
            return
        if action == "crash":
            os._exit(137)
        raise OSError(errno.EIO, "injected I/O error")

    return hook
