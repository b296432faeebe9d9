"""A peer that accepts connections and never answers, for the tests of the operator's
timeouts: a pod whose server hangs, an API server that holds a request.

What is real: a TCP socket on a real port, and the caller's own timeout closing its end
(seen here as the end of the stream), which is how a test tells that a caller gave up
without timing it.

``trickle``: a peer that starts an answer and sends it a byte a second, never ending
it. A read timeout counts from the last byte read, so the caller's own timeout never
fires: the call is held until ``release``, for as long as a test needs a round to be
stuck (``/healthz``), whatever the machine's load makes of the timings.
"""

from __future__ import annotations

import socket
import threading
import time


class Silent:
    """A pod that accepts connections and never answers; records each call until the
    caller gives up (closes its end) or ``release`` closes it from this side."""

    def __init__(self, *, trickle: bool = False) -> None:
        self.trickle = trickle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = threading.Event()
        self.gave_up = threading.Event()  # a caller closed a call we never answered
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="silent")
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._open.append(conn)
            self.accepted.set()
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()
            if self.trickle:
                threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        """A status line that never ends, a byte a second: cut off, it is no answer (a
        whole status line and headers would make a cut a complete, empty answer)."""
        try:
            conn.sendall(b"HTTP/1.1")
            while True:
                time.sleep(1.0)  # the pace of the bytes, not a wait for anything
                conn.sendall(b" ")
        except OSError:
            pass  # released from this side, or the caller closed the call

    def _drain(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
            self.gave_up.set()  # end of stream: the caller closed the call
        except OSError:
            pass  # released from this side

    def release(self) -> None:
        """Close every open call without an answer (the caller sees the connection cut)."""
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self.listener.close()
        self.release()
