"""The progress a long ``backup`` or ``restore`` shows on stderr (``progress.Meter``):
at most one line per interval however often it is fed, one more at the end; a line
rewritten in place on a terminal, log lines otherwise. The clock is the test's."""

from __future__ import annotations

import io

from stream_server.archive.progress import Meter, note, reporting


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_are_bounded_by_the_interval_not_by_the_work() -> None:
    out, clock = io.StringIO(), Clock()
    meter = Meter("restore", out, every=2.0, clock=clock, tty=False)
    for _ in range(1000):  # 1000 objects in 1.5 s: no line yet
        clock.now += 0.0015
        meter.add(2**20, 1)
    assert out.getvalue() == ""
    clock.now = 102.5
    meter.add(2**20, 1)
    for _ in range(50):  # fed again within the interval: still one line
        meter.add(0)
    meter.finish()
    lines = out.getvalue().splitlines()
    assert lines == [
        "restore: 1001.0 MiB, 1001 objects, 400.4 MiB/s, 2 s",
        "restore: 1001.0 MiB, 1001 objects, 400.4 MiB/s, 2 s (done)",
    ]


def test_on_a_terminal_one_line_is_rewritten() -> None:
    out, clock = io.StringIO(), Clock()
    meter = Meter("backup", out, every=2.0, clock=clock, tty=True)
    for step in range(1, 4):
        clock.now = 100.0 + 2 * step
        meter.set(step * 2**20, None)  # parts not known: no object count shown
    meter.finish()
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 4 and text.count("\n") == 1 and text.endswith("(done)\n")
    assert "objects" not in text and "backup: 3.0 MiB, 0.5 MiB/s, 6 s (done)" in text


def test_note_feeds_the_current_meter_only() -> None:
    out = io.StringIO()
    note(5)  # no meter: nothing happens
    meter = Meter("restore", out, clock=Clock(), tty=False)
    with reporting(meter):
        note(7)
        note(3, 2)
    note(100)
    assert (meter.bytes, meter.objects) == (10, 3)
