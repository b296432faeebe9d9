"""JSON mode: validate a body strictly and flatten one level of array into messages.

Each message is stored as the exact bytes the client sent for it (the
whitespace around it trimmed), never re-serialised: numbers such as ``2**70``
or ``1.10`` come back exactly as written, and the cost stays proportional to
the body. (Re-serialising every element with orjson once cost about 4 KiB of
retained memory per element: an 8 MiB body of ``[0,0,...]`` took 61 s and
17 GiB.)

How: a regular expression finds the array's structure (strings, brackets and
the commas between top-level elements) at C speed, and each element is then
validated on its own by orjson, which is strict where RFC 8259 and I-JSON
are: no ``NaN``/``Infinity``, no number that overflows a double, no lone
surrogates, valid UTF-8, nesting at most 1,024 deep. So a parse holds at
most one element's object tree at a time.

A large body is split in a worker process rather than on the event loop:
orjson and the regular expression hold the GIL, so a thread would not free
the loop, and a hostile body would stall every other client for seconds.
"""

from __future__ import annotations

import array
import asyncio
import multiprocessing
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait

import orjson

from stream_server.streams.errors import BadRequest, StreamError, TooLarge, Unavailable

# Bodies up to this size are split inline: their worst case (tiny nested
# elements, a few tokens each) stays around 20 ms. Larger ones go to the worker.
INLINE_MAX_BYTES = 64 * 1024
WORKER_TASKS = 256  # bodies one worker process splits before it is replaced
WORKER_MAX_RSS = 256 * 1024 * 1024  # a worker holding more after a body is replaced

_WS = b" \t\r\n"
# A string (escapes included), or one structural character that matters at the top level.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{},]', re.DOTALL)
_NESTED = re.compile(rb'["\[{]')  # an array without these is split at every comma


def _element_pattern(depth: int) -> re.Pattern[bytes]:
    """One top-level element of a valid array, nested at most ``depth`` deep: the
    regular expression engine then finds each element whole, in C."""
    string = rb'"(?:[^"\\]++|\\.)*+"'
    content = rb'(?:[^\[\]{}"]++|' + string + rb")*+"
    for _ in range(depth):
        box = rb"(?:\{" + content + rb"\}|\[" + content + rb"\])"
        content = rb'(?:[^\[\]{}"]++|' + string + rb"|" + box + rb")*+"
    return re.compile(rb'(?:[^\[\]{}",]++|' + string + rb"|" + box + rb")++", re.DOTALL)


_ELEMENT = _element_pattern(4)


def split_messages(body: bytes, *, allow_empty_array: bool, max_messages: int) -> list[bytes]:
    """The messages a JSON body stores, split here and now.

    An empty array is refused on append (a no-op that hides a client bug) and
    allowed on create (no initial messages).
    """
    found = split_fast(body, allow_empty_array=allow_empty_array, max_messages=max_messages)
    if found is not None:
        return found
    return messages(body, spans(body, max_messages), allow_empty_array=allow_empty_array)


def split_fast(body: bytes, *, allow_empty_array: bool, max_messages: int) -> list[bytes] | None:
    """The messages, when the quick way finds them; None when only a token-by-token
    scan can (elements nested deeper than the element pattern).

    The whole body is validated by orjson first (fast, and a small body's object
    tree is small), which also counts the elements; the split then needs no
    validation: a flat array splits at its commas, and the element pattern finds
    nested elements whole.
    """
    lo, hi = _trim(body, 0, len(body))
    try:
        value = orjson.loads(body)
    except (orjson.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None
    if not isinstance(value, list):
        return [body[lo:hi]]
    if len(value) > max_messages:
        raise TooLarge(f"more than {max_messages} JSON messages in one request")
    if not value:
        if not allow_empty_array:
            raise BadRequest("empty JSON array: nothing to append")
        return []
    inner = body[lo + 1 : hi - 1]
    if _NESTED.search(inner) is None:  # flat: no strings, no nesting, split at every comma
        return [part.strip(_WS) for part in inner.split(b",")]
    found = _ELEMENT.findall(inner)
    # Each element found whole, one comma between two: the split is exact. (An
    # element nested deeper than the pattern leaves brackets over.)
    if len(found) == len(value) and sum(map(len, found)) + len(found) - 1 == len(inner):
        return [m.strip(_WS) for m in found]
    return None


def spans(body: bytes, max_messages: int) -> array.array[int]:
    """Start and end offsets of each message in ``body``, flattened: [s0, e0, s1, e1, ...].

    Validates element by element, so that at most one element's object tree
    exists at a time, and stops at once past ``max_messages``: the worker's way,
    for bodies too large to parse whole. BadRequest for anything that is not
    strict JSON, TooLarge past ``max_messages`` elements.
    """
    lo, hi = _trim(body, 0, len(body))
    if lo == hi:
        raise BadRequest("invalid JSON: empty body")
    out = array.array("Q")
    if body[lo] != 0x5B:  # not "[": one message, the whole value
        _validate(body, lo, hi)
        out.extend((lo, hi))
        return out
    _scan(body, lo, hi, out, max_messages, validate=True)
    return out


def _scan(
    body: bytes, lo: int, hi: int, out: array.array[int], max_messages: int, *, validate: bool
) -> None:
    """The top-level elements of the array ``body[lo:hi]``, appended to ``out`` as offsets."""
    depth = 0
    start = lo + 1
    for m in _TOKEN.finditer(body, lo + 1, hi):
        c = body[m.start()]
        if c == 0x22:  # a string
            continue
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            if depth == 0:
                if c != 0x5D:
                    break
                if _trim(body, m.end(), hi)[0] != hi:
                    raise BadRequest("invalid JSON: data after the closing bracket")
                _element(body, start, m.start(), out, max_messages, last=True, validate=validate)
                return
            depth -= 1
        elif depth == 0:  # a comma between two elements
            _element(body, start, m.start(), out, max_messages, last=False, validate=validate)
            start = m.end()
    raise BadRequest("invalid JSON: unbalanced brackets or an unterminated string")


def _element(
    body: bytes,
    a: int,
    b: int,
    out: array.array[int],
    max_messages: int,
    *,
    last: bool,
    validate: bool,
) -> None:
    a, b = _trim(body, a, b)
    if a == b:
        if last and not out:
            return  # "[]" or "[ ]": no element at all
        raise BadRequest("invalid JSON: an empty array element")
    if len(out) // 2 >= max_messages:
        raise TooLarge(f"more than {max_messages} JSON messages in one request")
    if validate:
        _validate(body, a, b)
    out.extend((a, b))


def _validate(body: bytes, a: int, b: int) -> None:
    try:
        orjson.loads(memoryview(body)[a:b])
    except (orjson.JSONDecodeError, RecursionError, MemoryError) as exc:
        raise BadRequest(f"invalid JSON: {exc}") from None


def _trim(body: bytes, a: int, b: int) -> tuple[int, int]:
    while a < b and body[a] in _WS:
        a += 1
    while b > a and body[b - 1] in _WS:
        b -= 1
    return a, b


def _slices(body: bytes, offsets: array.array[int]) -> list[bytes]:
    return [body[offsets[i] : offsets[i + 1]] for i in range(0, len(offsets), 2)]


def messages(body: bytes, offsets: array.array[int], *, allow_empty_array: bool) -> list[bytes]:
    if not offsets and not allow_empty_array:
        raise BadRequest("empty JSON array: nothing to append")
    return _slices(body, offsets)


def _worker_init() -> None:
    """In the worker: exit when the server does (a SIGKILLed server would otherwise
    leave it waiting for work forever)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    wait([sentinel])
    os._exit(0)


def _spans_in_worker(body: bytes, max_messages: int) -> tuple[array.array[int] | StreamError, int]:
    """In the worker: the spans or the refusal, and the worker's resident memory after."""
    try:
        result: array.array[int] | StreamError = spans(body, max_messages)
    except StreamError as exc:
        result = exc
    return result, _resident_bytes()


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0  # not Linux: the worker is replaced by task count only


class JsonSplitter:
    """Splits JSON bodies: small ones inline, large ones in a worker process.

    The worker is replaced after ``WORKER_TASKS`` bodies, or once it holds more
    than ``WORKER_MAX_RSS``, so that memory a hostile body made it take goes back
    to the system. Replacing is done here rather than with ``max_tasks_per_child``,
    which can deadlock queued work on Python 3.11 to 3.13 (CPython gh-115634).
    """

    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._pool: ProcessPoolExecutor | None = None
        self._pool_tasks = 0
        self._closed = False

    async def split(self, body: bytes, *, allow_empty_array: bool) -> list[bytes]:
        """Small bodies the quick way, on the loop; the rest in the worker process."""
        if len(body) <= INLINE_MAX_BYTES:
            found = split_fast(
                body, allow_empty_array=allow_empty_array, max_messages=self.max_messages
            )
            if found is not None:
                return found
        return await self._split_in_worker(body, allow_empty_array=allow_empty_array)

    def split_now(self, body: bytes, *, allow_empty_array: bool) -> list[bytes]:
        """On the loop, for a body the store could not split ahead (the stream was
        replaced while it waited): a small body only, as for ``split``. A large one
        would stall every other client, so that rare race asks the client to retry."""
        if len(body) > INLINE_MAX_BYTES:
            raise Unavailable("the stream changed while the JSON body was parsed; retry")
        return split_messages(
            body, allow_empty_array=allow_empty_array, max_messages=self.max_messages
        )

    async def _split_in_worker(self, body: bytes, *, allow_empty_array: bool) -> list[bytes]:
        pool = self._take_pool()
        loop = asyncio.get_running_loop()
        try:
            result, resident = await loop.run_in_executor(
                pool, _spans_in_worker, body, self.max_messages
            )
        except BrokenProcessPool:  # the worker died (out of memory, killed)
            self._retire(pool)
            raise Unavailable("the JSON parser process failed; retry later") from None
        if resident > WORKER_MAX_RSS:
            self._retire(pool)
        if isinstance(result, StreamError):
            raise result
        return messages(body, result, allow_empty_array=allow_empty_array)

    def _take_pool(self) -> ProcessPoolExecutor:
        if self._closed:
            raise Unavailable("the server is stopping")
        if self._pool is not None and self._pool_tasks >= WORKER_TASKS:
            self._retire(self._pool)
        if self._pool is None:
            # Not "fork": this process holds LMDB environments and threads.
            ctx = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker_init)
            self._pool_tasks = 0
        self._pool_tasks += 1
        return self._pool

    def _retire(self, pool: ProcessPoolExecutor) -> None:
        """Give ``pool`` no more work: it finishes what it has, then its process exits."""
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False)

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
