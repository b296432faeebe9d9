"""``--host ::``: one socket for IPv6 and IPv4 alike, and IPv4's alone on a machine
without IPv6 (``stream_server/listen.py``). Real sockets, connected to over ``::1`` and
``127.0.0.1``.

A dual-stack socket is what Linux makes by default (``net.ipv6.bindv6only`` 0), so
on most machines a plain IPv6 socket on ``::`` would pass the first test too; the
namespaced one (``test_listen_processes.py``) sets ``bindv6only`` to 1 and fails
without ``IPV6_V6ONLY`` off.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket

import pytest

from stream_server import listen
from stream_server.config import add_arguments, settings_from


def reaches(address: str, port: int) -> bool:
    """Whether a TCP connection to ``address``:``port`` is accepted."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        try:
            s.connect((address, port))
        except OSError:
            return False
        return True


def test_any_is_reached_over_ipv6_and_ipv4():
    with listen.listen_socket(listen.ANY, 0) as sock:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        port = sock.getsockname()[1]
        assert reaches("::1", port)
        assert reaches("127.0.0.1", port)


def test_an_ipv6_address_is_not_reached_over_ipv4():
    """Only ``::`` means both: a given IPv6 address is that address alone."""
    with listen.listen_socket("::1", 0) as sock:
        port = sock.getsockname()[1]
        assert reaches("::1", port)
        assert not reaches("127.0.0.1", port)


def no_ipv6(family: int, kind: int) -> socket.socket:
    """A machine whose kernel has no IPv6 (``ipv6.disable=1``): its answer to an IPv6
    socket, and real sockets otherwise."""
    if family == socket.AF_INET6:
        raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
    return socket.socket(family, kind)


def test_any_without_ipv6_listens_on_every_ipv4_address_and_says_so(caplog):
    with (
        caplog.at_level(logging.WARNING, logger="stream_server"),
        listen.listen_socket(listen.ANY, 0, make=no_ipv6) as sock,
    ):
        assert sock.family == socket.AF_INET
        assert sock.getsockname()[0] == "0.0.0.0"
        assert reaches("127.0.0.1", sock.getsockname()[1])
    assert "this machine has no IPv6" in caplog.text
    assert "listening on 0.0.0.0, IPv4 only" in caplog.text


def test_an_ipv6_address_without_ipv6_is_refused_naming_the_host():
    with pytest.raises(listen.CannotListen, match=r"^--host ::1: .*\(env DS_HOST\)"):
        listen.listen_socket("::1", 0, make=no_ipv6)


def test_any_is_a_host_the_settings_take():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from(parser.parse_args(["--host", "::"]), {}).host == "::"
