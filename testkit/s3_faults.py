"""A loopback HTTP proxy in front of an object store, for the archive's fault tests.

The server under test is given the proxy's address as ``--archive-endpoint``; the
test switches ``mode``: ``"pass"`` forwards each request as it came (the Host
header kept: it is signed), ``"500"`` answers every request 500 InternalError,
``"stall"`` holds requests until the mode changes. Threads, one per connection.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from testkit.servers import free_port

_ERROR = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>injected by the test</Message></Error>"
)


class S3Faults:
    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.port = free_port()
        self.mode = "pass"
        self.requests = 0
        self._changed = threading.Condition()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _any(self) -> None:
                proxy.requests += 1
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._changed:
                    proxy._changed.wait_for(lambda: proxy.mode != "stall")
                    mode = proxy.mode
                if mode == "500":
                    self.send_response(500)
                    self.send_header("content-type", "application/xml")
                    self.send_header("content-length", str(len(_ERROR)))
                    self.end_headers()
                    self.wfile.write(_ERROR)
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname or "127.0.0.1", proxy.upstream.port, timeout=60
                )
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    conn.putheader(name, value)
                conn.endheaders(body)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, mode: str) -> None:
        assert mode in ("pass", "500", "stall"), mode
        with self._changed:
            self.mode = mode
            self._changed.notify_all()

    def close(self) -> None:
        self.set("pass")
        self.server.shutdown()
        self.server.server_close()
