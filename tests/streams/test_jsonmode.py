"""JSON mode's splitter: exact bytes kept, strict validation, the message cap."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_server.streams.errors import BadRequest, TooLarge, Unavailable
from stream_server.streams.jsonmode import (
    INLINE_MAX_BYTES,
    JsonSplitter,
    messages,
    spans,
    split_fast,
    split_messages,
)


def split(body: bytes, *, create: bool = False, cap: int = 1000) -> list[bytes]:
    return split_messages(body, allow_empty_array=create, max_messages=cap)


def by_worker_rules(body: bytes, *, create: bool = True, cap: int = 1000) -> list[bytes]:
    """The element-by-element splitter the worker process runs."""
    return messages(body, spans(body, cap), allow_empty_array=create)


@pytest.mark.parametrize("how", [split, by_worker_rules])
def test_messages_keep_the_exact_bytes_sent(how):
    body = (
        b' [ 1.10 , 1180591620717411303424 ,1e2, -0, "a,]\\"\\u00e9", "\xc3\xa9",\n'
        b'  {"a": [1, {"b": [2]}]}, [[[[[[1]]]]]], true ,null ] \n'
    )
    assert how(body) == [
        b"1.10",
        b"1180591620717411303424",
        b"1e2",
        b"-0",
        b'"a,]\\"\\u00e9"',
        b'"\xc3\xa9"',
        b'{"a": [1, {"b": [2]}]}',
        b"[[[[[[1]]]]]]",
        b"true",
        b"null",
    ]
    assert how(b'  {"k": 2.50}\n') == [b'{"k": 2.50}']


BAD = [
    b"NaN",
    b"[Infinity]",
    b"[-Infinity, 1]",
    b"[1e400]",
    b'"\\ud800"',
    b"[" * 2000 + b"]" * 2000,
    b"\xff\xfe",
    b"[1,]",
    b"[,1]",
    b"[1 2]",
    b"[1]x",
    b'["a]',
    b"[{]}",
    b"{nope",
    b"",
    b"   ",
    b"[1, 2",
]


@pytest.mark.parametrize("body", BAD, ids=range(len(BAD)))
@pytest.mark.parametrize("how", [split, by_worker_rules])
def test_anything_but_strict_json_is_a_bad_request(how, body):
    with pytest.raises(BadRequest):
        how(body)


def test_the_message_cap():
    assert len(split(b"[" + b",".join([b"1"] * 10) + b"]", cap=10)) == 10
    for how in (split, by_worker_rules):
        with pytest.raises(TooLarge):
            how(b"[" + b",".join([b"1"] * 11) + b"]", cap=10)
        with pytest.raises(TooLarge):
            how(b"[" + b",".join([b'{"a":[1]}'] * 11) + b"]", cap=10)


def test_an_empty_array_only_on_create():
    assert split(b"[ ]", create=True) == []
    with pytest.raises(BadRequest, match="empty JSON array"):
        split(b"[]")


def test_deeply_nested_elements_leave_the_quick_way_to_the_worker():
    body = b"[" + b",".join([b"[[[[[[1]]]]]]"] * 3) + b"]"
    assert split_fast(body, allow_empty_array=False, max_messages=10) is None
    assert split(body) == [b"[[[[[[1]]]]]]"] * 3


def test_large_bodies_are_split_in_a_worker_process():
    big = b"[" + b",".join([b'{"n": 1.50}'] * (INLINE_MAX_BYTES // 8)) + b"]"
    nested = b"[" + b",".join([b"[[[[[[1]]]]]]"] * 5) + b"]"
    splitter = JsonSplitter(max_messages=100_000)

    async def run() -> tuple[list[bytes], list[bytes]]:
        try:
            return (
                await splitter.split(big, allow_empty_array=False),
                await splitter.split(nested, allow_empty_array=False),
            )
        finally:
            splitter.close()

    got_big, got_nested = asyncio.run(run())
    assert got_big == [b'{"n": 1.50}'] * (INLINE_MAX_BYTES // 8)
    assert got_nested == [b"[[[[[[1]]]]]]"] * 5

    async def refused(body: bytes) -> None:
        bad = JsonSplitter(max_messages=10**6)
        try:
            await bad.split(body, allow_empty_array=False)
        finally:
            bad.close()

    with pytest.raises(BadRequest, match="empty array element"):
        asyncio.run(refused(b"[" + b"1," * INLINE_MAX_BYTES + b"]"))
    with pytest.raises(BadRequest, match="infinity"):
        asyncio.run(refused(b"[" + b"1," * INLINE_MAX_BYTES + b"1e400]"))


def test_a_body_split_late_is_split_on_the_loop_only_when_small():
    splitter = JsonSplitter(max_messages=10**6)
    small = b"[1,2]"
    assert splitter.split_now(small, allow_empty_array=False) == [b"1", b"2"]
    large = b"[" + b"1," * INLINE_MAX_BYTES + b"1]"
    with pytest.raises(Unavailable, match="retry"):
        splitter.split_now(large, allow_empty_array=False)


def _worker_pid() -> int:
    import os

    return os.getpid()


def test_the_worker_is_replaced_after_its_share_of_bodies_and_when_it_dies(monkeypatch):
    from stream_server.streams import jsonmode

    monkeypatch.setattr(jsonmode, "WORKER_TASKS", 2)
    big = b"[" + b",".join([b'"x"'] * INLINE_MAX_BYTES) + b"]"
    splitter = JsonSplitter(max_messages=10**6)

    async def run() -> list[int]:
        pids = []
        try:
            for _ in range(3):
                assert len(await splitter.split(big, allow_empty_array=False)) == INLINE_MAX_BYTES
                assert splitter._pool is not None
                pool = splitter._pool
                pids.append(await asyncio.get_running_loop().run_in_executor(pool, _worker_pid))
            # A worker that dies (out of memory, killed) fails that body with 503, not the next.
            import os
            import signal

            os.kill(pids[-1], signal.SIGKILL)
            with pytest.raises(Unavailable):
                await splitter.split(big, allow_empty_array=False)
            assert len(await splitter.split(big, allow_empty_array=False)) == INLINE_MAX_BYTES
        finally:
            splitter.close()
        return pids

    pids = asyncio.run(run())
    # Two bodies per worker: the third went to a new one.
    assert len(set(pids)) >= 2, pids


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(JSON_VALUES, max_size=12), spaced=st.booleans())
def test_stored_messages_read_back_as_the_values_sent(items, spaced):
    sep = ", \n" if spaced else ","
    texts = [json.dumps(v, ensure_ascii=spaced) for v in items]
    body = ("[" + sep.join(texts) + "]").encode()
    for how in (split, by_worker_rules):
        got = how(body, create=True)
        assert got == [t.encode() for t in texts]
        assert json.loads(b"[" + b",".join(got) + b"]") == items
