"""An ``fsio`` recorder that keeps the disk-changing calls in order, for tests that check
the order in which a step makes its writes durable (the set id file, leaving a set).

Attach it with ``fsio.attach(recorder)`` and detach with ``fsio.attach(None)``.
"""

from __future__ import annotations

from typing import Any


class Recorder:
    def __init__(self) -> None:
        self.ops: list[tuple[Any, ...]] = []

    def record(self, op: tuple[Any, ...]) -> None:
        self.ops.append(op)
