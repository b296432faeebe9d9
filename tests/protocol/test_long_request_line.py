"""A request line too long for the HTTP parser is a head too large (431), not a bad request.

Found by trying docs/limits.md (issue 26): a 70,000-character path was answered
``400 Invalid HTTP request received.``, because the parser keeps a request
target's offsets in 16 bits and fails on a longer one; the docs answer a head
past the limits with 431. Needs a real server: the parser is the connection's
(``http_limits``), not the app's.
"""

from __future__ import annotations

import pytest

from testkit.server_process import raw_get, read_until_closed

pytestmark = pytest.mark.processes


@pytest.mark.parametrize("length", [65_600, 70_000])
def test_a_path_past_the_parser_s_limit_is_answered_431(shared_server, length: int) -> None:
    s = raw_get(shared_server.port, "/v1/stream/" + "a" * length, timeout=10)
    answer = read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert answer.endswith(b"request headers too large or too many\n")


def test_a_path_within_it_is_still_the_app_s_400(shared_server) -> None:
    s = raw_get(shared_server.port, "/v1/stream/" + "a" * 2000 + "?offset=-1", timeout=10)
    answer = b""
    with s:  # the connection stays open (keep-alive): read the one answer
        while not answer.endswith(b"bytes\n") and (chunk := s.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert answer.endswith(b"stream path longer than 1024 bytes\n")
