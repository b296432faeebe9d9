"""``--host ::`` in processes: a server answers over ``::1`` and ``127.0.0.1``, and the
socket is dual-stack in a network namespace whose ``net.ipv6.bindv6only`` is 1 (a per
namespace setting, as some distributions and hardened nodes have it), where an IPv6
socket left as the machine makes it would take IPv6 alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import httpx
import pytest

pytestmark = pytest.mark.processes


NAMESPACED = textwrap.dedent(
    """
    import socket, subprocess, sys
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv6/bindv6only", "w") as f:
        f.write("1")
    from stream_server import listen
    with listen.listen_socket(listen.ANY, 0) as sock:
        port = sock.getsockname()[1]
        for address, family in (("::1", socket.AF_INET6), ("127.0.0.1", socket.AF_INET)):
            with socket.socket(family) as s:
                s.settimeout(10)
                s.connect((address, port))
    print("both")
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs root")
@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None, reason="util-linux, iproute2"
)
def test_any_is_dual_stack_where_the_machine_defaults_to_ipv6_only():
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", NAMESPACED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "both", done.stderr


def test_a_server_on_any_answers_over_ipv6_and_ipv4(server_factory):
    srv = server_factory("--host", "::").start()
    for origin in (f"http://[::1]:{srv.port}", f"http://127.0.0.1:{srv.port}"):
        assert httpx.get(f"{origin}/readyz", timeout=10).status_code == 200, origin
    assert "listening on :: port" in srv.log()
