"""One write per response (``stream_server/response_writes.py``): a response's head
goes out with its body when both come in one turn of the loop, alone at the end of
the turn otherwise, and always before anything written after it. The transport
here records what reaches it, in order, as a socket would receive it."""

from __future__ import annotations

import asyncio

from stream_server.response_writes import JOIN_UP_TO, HeadWithBody


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closed = False

    def write(self, data) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, parts) -> None:
        self.calls.append(("writelines", b"".join(bytes(p) for p in parts)))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def test_a_head_and_body_sent_in_one_turn_are_one_write():
    t = Recorder()
    w = HeadWithBody(t, asyncio.get_running_loop())
    w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
    w.write(b"hello")
    await asyncio.sleep(0)
    assert t.calls == [("write", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")]


async def test_a_head_without_a_body_in_its_turn_goes_out_alone_and_first():
    t = Recorder()
    w = HeadWithBody(t, asyncio.get_running_loop())
    w.write(b"HEAD\r\n\r\n")
    assert t.calls == []
    await asyncio.sleep(0)  # the end of the turn
    assert t.calls == [("write", b"HEAD\r\n\r\n")]
    w.write(b"event: 1\n\n")  # a stream's events, later
    w.write(b"event: 2\n\n")
    assert [data for _, data in t.calls] == [b"HEAD\r\n\r\n", b"event: 1\n\n", b"event: 2\n\n"]


async def test_a_large_body_follows_the_head_without_a_copy_and_close_sends_the_head():
    t = Recorder()
    loop = asyncio.get_running_loop()
    w = HeadWithBody(t, loop)
    big = b"x" * (JOIN_UP_TO + 1)
    w.write(b"HEAD\r\n\r\n")
    w.write(big)
    assert t.calls == [("writelines", b"HEAD\r\n\r\n" + big)]

    t2 = Recorder()
    w2 = HeadWithBody(t2, loop)
    w2.write(b"HTTP/1.1 500\r\n\r\n")
    w2.close()  # the app failed after its head: the head still goes, then the close
    assert t2.calls == [("write", b"HTTP/1.1 500\r\n\r\n")] and t2.closed
    await asyncio.sleep(0)
    assert len(t2.calls) == 1  # not sent twice
    assert w2.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's
