"""Virtual time: an asyncio event loop whose clock moves only when nothing is ready,
and the members' machines (``Host``: a clock each) and server processes
(``Process``: one per start, which can be paused and dies at a crash).

The simulation runs the server's own async replication code (the role loop,
its Lease writes, the shipper), so its scheduler is asyncio's: ready callbacks
in FIFO order, timers in time order. Where a real loop would block in
``select`` until the next timer, this one moves its clock to that timer at
once. Nothing reads the wall clock, no thread or socket exists (not even the
self-pipe a selector loop opens), so a run is a pure function of its seed and
a minute of replica-set time takes milliseconds.

Every callback belongs to the context it runs in, and a member's code runs in
contexts that name its ``Process`` (``PROCESS``). There:

- the clock (``loop.time()``, what asyncio's timers and ``boottime`` read, and the
  clock the role loop and the read freshness are given) is the host's: it may run
  faster or slower than true time (``Host.set_rate``), as a machine's clock does,
  and starts at its own reading, for readings of two machines are never
  comparable. A timer set by the process's code is due when the host's clock
  reaches it (set again if a slower rate since has not got there yet; a faster
  one makes it late, as a busy machine's timers are);
- while the process is paused (``Process.pause``: SIGSTOP), none of its callbacks
  runs: whatever comes due (a timer, a task's step, the wake-up of a task whose
  answer arrived) is held, and at ``Process.resume`` (SIGCONT) every held callback
  runs at once, in the order they came due, unless it was cancelled meanwhile.
  The clock runs on (CLOCK_BOOTTIME does), and messages sent before the pause
  travel on (``call_true``: they are the network's);
- once the process died (``Process.kill``: a crash, kill -9, paused or not), none
  of its callbacks ever runs again, and its tasks' coroutines are closed where
  they stand: a dead process takes no further step, not even the handling of its
  own cancellation (which asyncio's ``wait_for`` of Python 3.11 can swallow, a
  zombie that went on renewing the Lease of a member that had crashed).

Outside a process (clients, the faults, the network, the Lease's API server) time
is true time.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

START = 1000.0  # seconds: a stamp of 0 means "none" to the freshness rules, so not 0
NS = 1_000_000_000
# Seconds past the moment a host's clock reaches a timer's reading that the timer is set
# again for, when it came up before (asyncio runs a timer up to its clock resolution
# early, and a reading converted to true time and back may fall short by a rounding
# error): never before, or code that waits out ``deadline - loop.time()`` would spin.
LATER = 1e-7


class Stalled(RuntimeError):
    """Nothing is ready and no timer is due: the simulation has nothing left to run."""


class _Advance:
    """The selector's place in asyncio's loop: waiting ``timeout`` moves the clock."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise Stalled("no task is ready and no timer is due")
        self.loop.now = max(self.loop.now, self.loop.now + timeout)
        return []

    def close(self) -> None:
        pass


class Host:
    """One member's machine: its clock (module doc)."""

    def __init__(self, loop: VirtualLoop, reading: float) -> None:
        self.loop = loop
        self.rate = 1.0  # clock seconds per true second
        self.slowest = self.fastest = 1.0  # the rates it has run at
        self._since = loop.now  # true time the rate was last set
        self._reading = reading  # the clock's reading then

    def now(self) -> float:
        """Seconds on this machine's clock."""
        return self._reading + (self.loop.now - self._since) * self.rate

    def now_ns(self) -> int:
        return int(self.now() * NS)

    def true_time(self, reading: float) -> float:
        """When (true time) this clock will read ``reading`` at its present rate."""
        return self._since + (reading - self._reading) / self.rate

    def set_rate(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError(f"a clock runs forwards: rate {rate}")
        self._reading, self._since = self.now(), self.loop.now
        self.rate = rate
        self.slowest, self.fastest = min(self.slowest, rate), max(self.fastest, rate)


class Process:
    """One start of a member's server on its host: the tasks its code started, and
    whether it runs, is paused or died (module doc)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.tasks: list[asyncio.Task[Any]] = []
        self.paused = False
        self.dead = False
        self._held: list[_Call] = []

    def adopt(self, task: asyncio.Task[Any]) -> None:
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(task)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Everything held runs now, in the order it came due (module doc)."""
        self.paused = False
        held, self._held = self._held, []
        for call in held:
            self.host.loop.again(call)

    def hold(self, call: _Call) -> None:
        self._held.append(call)

    def kill(self) -> list[asyncio.Task[Any]]:
        """Nothing of this process runs again: what it held is dropped, and its tasks'
        coroutines are closed where they stand (their ``finally`` blocks run now, and
        whatever those schedule is dropped too). Returns the tasks, which stay pending:
        the caller leaves them out of any wait."""
        self.dead, self.paused = True, False
        self._held = []
        tasks, self.tasks = [t for t in self.tasks if not t.done()], []
        for task in tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]  # abandoned, on purpose
            # A coroutine that awaits in a finally block raises here: it is dead anyway.
            with contextlib.suppress(RuntimeError):
                task.get_coro().close()  # type: ignore[union-attr]
        return tasks


class _Call:
    """A callback of a host's code, as the loop runs it (``VirtualLoop._run``)."""

    __slots__ = ("args", "callback", "clock", "context", "handle", "process", "reading")

    def __init__(
        self,
        process: Process,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context,
        clock: Host | None = None,
        reading: float = 0.0,
    ) -> None:
        self.process = process  # whose code it is
        self.callback = callback
        self.args = args
        self.context = context
        self.clock = clock  # a timer: due when this host's clock reads ``reading``
        self.reading = reading
        self.handle: asyncio.Handle | None = None  # what the caller holds (and may cancel)


PROCESS: contextvars.ContextVar[Process | None] = contextvars.ContextVar("process", default=None)


class VirtualLoop(asyncio.BaseEventLoop):
    """A single-threaded event loop on virtual time, its hosts' clocks and pauses
    (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START  # true time
        self._selector = _Advance(self)

    def time(self) -> float:
        process = PROCESS.get()
        return self.now if process is None else process.host.now()

    def call_soon(  # type: ignore[override]
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        context = contextvars.copy_context() if context is None else context
        process = context.get(PROCESS)
        if process is None:
            return super().call_soon(callback, *args, context=context)
        call = _Call(process, callback, args, context)
        call.handle = super().call_soon(self._run, call, context=context)
        return call.handle

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """A timer at ``when`` on the caller's clock (its host's, or true time)."""
        caller = PROCESS.get()
        clock = None if caller is None else caller.host
        due = when if clock is None else clock.true_time(when)
        context = contextvars.copy_context() if context is None else context
        process = context.get(PROCESS)
        if process is None:
            return super().call_at(due, callback, *args, context=context)
        call = _Call(process, callback, args, context, clock, when)
        handle = super().call_at(due, self._run, call, context=context)
        call.handle = handle
        return handle

    def call_true(
        self, delay: float, callback: Callable[..., object], *args: Any
    ) -> asyncio.TimerHandle:
        """``callback(*args)`` after ``delay`` seconds of true time, in no process's
        context: a message in flight, which no pause, death or clock holds back."""
        return super().call_at(self.now + delay, callback, *args, context=contextvars.Context())

    def again(self, call: _Call) -> None:
        """Run ``call`` as soon as may be (a held callback, or a timer not yet due)."""
        super().call_soon(self._run, call, context=call.context)

    def _run(self, call: _Call) -> None:
        if call.process.dead or (call.handle is not None and call.handle.cancelled()):
            return  # dead, or cancelled while held or before its host's clock got there
        if call.clock is not None and call.clock.now() < call.reading:
            # Not due by its host's clock yet (that clock slowed since, or a rounding).
            due = call.clock.true_time(call.reading) + LATER
            super().call_at(due, self._run, call, context=call.context)
            return
        call.clock = None
        if call.process.paused:
            call.process.hold(call)
            return
        call.callback(*call.args)

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        """Only a call from another thread needs waking the loop; none exists here."""
