"""The simulation's machines and processes (testkit/simulate/clock.py): a process paused
runs nothing and then everything it held at once, in order; a dead one never runs again;
a host's clock, at its own rate, is the one its code reads and its timers keep.

Each test drives a bare ``VirtualLoop``, so a broken pause or clock shows here before it
hides in a seed's history.
"""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from testkit.simulate.clock import PROCESS, START, Host, Process, VirtualLoop
from testkit.simulate.members import owned_task


def _process(loop: VirtualLoop, reading: float = START) -> tuple[Process, contextvars.Context]:
    process = Process(Host(loop, reading))
    context = contextvars.copy_context()
    context.run(PROCESS.set, process)
    return process, context


def _ticker(loop: VirtualLoop, log: list[tuple[str, float]], name: str, period: float) -> None:
    """A process's code that notes the true time each ``period`` of its own clock."""

    async def tick() -> None:
        for _ in range(3):
            await asyncio.sleep(period)
            log.append((name, round(loop.now - START, 6)))

    loop.create_task(tick())


def test_a_paused_process_runs_nothing_then_everything_it_held_in_order():
    loop = VirtualLoop()
    process, context = _process(loop)
    log: list[tuple[str, float]] = []
    context.run(_ticker, loop, log, "ticker", 1.0)
    loop.call_true(1.5, process.pause)
    loop.call_true(4.2, process.resume)
    loop.run_until_complete(asyncio.sleep(6.0))
    # 1.0 ran; 2.0 came due paused and ran at the resume (4.2); the next tick is a second
    # after that one ran, by the clock that ran on.
    assert log == [("ticker", 1.0), ("ticker", 4.2), ("ticker", 5.2)]
    loop.close()


def test_what_arrives_for_a_paused_process_waits_and_a_callback_cancelled_meanwhile_never_runs():
    loop = VirtualLoop()
    process, context = _process(loop)
    ran: list[str] = []
    process.pause()
    context.run(loop.call_soon, ran.append, "first")
    kept = context.run(loop.call_later, 0.5, ran.append, "timer")
    dropped = context.run(loop.call_later, 0.6, ran.append, "cancelled")
    loop.call_true(0.1, ran.append, "no process")  # the network's: never held
    loop.call_true(1.0, dropped.cancel)
    loop.call_true(2.0, process.resume)
    loop.run_until_complete(asyncio.sleep(3.0))
    assert ran == ["no process", "first", "timer"]
    assert not kept.cancelled()
    loop.close()


def test_a_dead_process_never_runs_again_and_its_tasks_are_closed_where_they_stand():
    loop = VirtualLoop()
    process, context = _process(loop)
    steps: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(1.0)
            steps.append("woke")  # must never happen: it died asleep
        finally:
            steps.append("closed")

    loop.set_task_factory(owned_task)  # a task belongs to the process that created it
    task = context.run(loop.create_task, work())
    loop.call_true(0.5, process.pause)
    loop.call_true(0.7, lambda: steps.append(f"killed {len(process.kill())}"))
    context.run(loop.call_later, 0.9, steps.append, "held")
    loop.run_until_complete(asyncio.sleep(3.0))
    assert steps == ["closed", "killed 1"]
    assert not task.done()  # abandoned: whoever waits for the process leaves it out
    loop.close()


@pytest.mark.parametrize("rate", [0.5, 2.0])
def test_a_host_clock_at_its_rate_is_what_its_code_reads_and_its_timers_keep(rate):
    loop = VirtualLoop()
    process, context = _process(loop, reading=START + 500.0)
    process.host.set_rate(rate)
    log: list[tuple[str, float]] = []
    context.run(_ticker, loop, log, "host", 1.0)
    _ticker(loop, log, "true", 1.0)
    loop.run_until_complete(asyncio.sleep(7.0))
    assert [t for name, t in log if name == "host"] == pytest.approx([1 / rate, 2 / rate, 3 / rate])
    assert [t for name, t in log if name == "true"] == pytest.approx([1.0, 2.0, 3.0])
    assert context.run(loop.time) == pytest.approx(START + 500.0 + 7.0 * rate)
    assert loop.time() == pytest.approx(START + 7.0)  # outside a process: true time
    loop.close()


def test_a_timer_set_before_its_clock_slowed_is_not_early_by_that_clock():
    loop = VirtualLoop()
    process, context = _process(loop)
    fired: list[float] = []
    context.run(loop.call_later, 2.0, lambda: fired.append(process.host.now()))
    loop.call_true(1.0, process.host.set_rate, 0.5)  # halfway, the clock halves its pace
    loop.run_until_complete(asyncio.sleep(5.0))
    assert fired and fired[0] >= START + 2.0
    assert loop.now - START >= 3.0 - 1e-6  # 1 s at rate 1, then 1 s of clock at rate 0.5
    with pytest.raises(ValueError, match="forwards"):
        process.host.set_rate(0.0)
    loop.close()
