"""A write refused before it reaches the protocol layer, as the HTTP answer it gets.

The node's gates give one (a recovering store, a standby, a primary short of
in-sync standbys, a replica cluster, an archive that fell behind), and the app or
a worker's relay sends it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
