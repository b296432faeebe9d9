"""A start that cannot work stops at once with exit status 2, naming the flag and the
variable, and no traceback (issue 41).

Before: ``--workers 1000`` forked until the machine ran out of memory; a data
directory that was a file, or under a parent that is not there, ended in a
traceback; ``--host 999.1.1.1`` logged uvicorn's resolver error without the flag,
then "stopped cleanly"; a port in use was reported after uvicorn had started the
app (exit 3), or, with workers, only after 10 s of retries. What only a process
shows (its exit status, its stderr, a port held by another) runs as a process;
the checks themselves run in-process.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import time
from pathlib import Path

import pytest

from stream_server import listen
from stream_server.config import add_arguments, checks, settings_from
from testkit.servers import env_with, free_port, stream_server_command

pytestmark = pytest.mark.processes


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from(parser.parse_args(list(argv)), {})


def refused(*argv: str) -> str:
    with pytest.raises(ValueError) as caught:
        parse(*argv)
    return str(caught.value)


# --- In-process: each check, at its edge -------------------------------------------------


def test_workers_are_bounded_by_a_multiple_of_the_cpus_the_process_may_use(tmp_path):
    most = checks.WORKERS_PER_CPU * len(os.sched_getaffinity(0))
    assert parse("--workers", str(most), "--data-dir", str(tmp_path / "d")).workers == most
    message = refused("--workers", str(most + 1), "--data-dir", str(tmp_path / "d"))
    assert "--workers" in message and "DS_WORKERS" in message, message
    assert f"at most {most}" in message, message


@pytest.mark.parametrize(
    ("flag", "most"),
    [("--max-body-bytes", checks.MAX_BODY_BYTES), ("--max-header-bytes", checks.MAX_HEADER_BYTES)],
)
def test_memory_held_per_request_is_bounded(tmp_path, flag, most):
    data = str(tmp_path / "d")
    parse(flag, str(most), "--data-dir", data)
    message = refused(flag, str(most + 1), "--data-dir", data)
    env = "DS_" + flag[2:].upper().replace("-", "_")
    assert flag in message and env in message, message


def test_connections_are_bounded_by_the_open_file_limit(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit here to bound --max-connections by")
    data = str(tmp_path / "d")
    parse("--max-connections", str(hard), "--data-dir", data)
    message = refused("--max-connections", str(hard + 1), "--data-dir", data)
    assert "--max-connections" in message and "DS_MAX_CONNECTIONS" in message, message


def test_the_data_directory_must_be_a_directory_or_makeable(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "--data-dir is not a directory" in refused("--data-dir", str(a_file))
    message = refused("--data-dir", str(tmp_path / "missing" / "data"))
    assert "--data-dir cannot be made" in message and "DS_DATA_DIR" in message, message
    assert parse("--data-dir", str(tmp_path / "new")).data_dir == tmp_path / "new"
    assert not (tmp_path / "new").exists()  # checked, not made: the start makes it


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid", "192.0.2.1"])
def test_the_host_must_be_an_address_of_this_machine(tmp_path, host):
    message = refused("--host", host, "--data-dir", str(tmp_path / "d"))
    assert message.startswith("--host ") and "DS_HOST" in message, message


def test_only_a_killed_writer_s_runtime_naming_the_port_is_waited_for(tmp_path: Path):
    beyond = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it
    dead = tmp_path / f"{listen.RUNTIME_PREFIX}{beyond}-abc"
    live = tmp_path / f"{listen.RUNTIME_PREFIX}1-def"  # pid 1 always runs
    for d, port in ((dead, 5001), (live, 5002)):
        d.mkdir()
        (d / listen.PORT_FILE).write_text(str(port))
    assert listen.orphans_hold(5001, tmp_path)
    assert not listen.orphans_hold(5002, tmp_path)  # its writer runs: it is not an orphan
    assert not listen.orphans_hold(5003, tmp_path)


# --- Real processes: the exit status and what stderr says ----------------------------------


def start(tmp_path: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stream_server_command(port, tmp_path / "data", *args),
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_refused(proc: subprocess.CompletedProcess[str], flag: str, env: str) -> None:
    out = proc.stderr + proc.stdout
    assert proc.returncode == 2, out
    assert flag in out and env in out, out
    assert "Traceback" not in out and "stopped cleanly" not in out, out


@pytest.mark.parametrize(
    ("args", "flag", "env"),
    [
        (("--workers", "1000"), "--workers", "DS_WORKERS"),
        (("--host", "999.1.1.1"), "--host", "DS_HOST"),
        (("--data-dir", "{file}"), "--data-dir", "DS_DATA_DIR"),
        (("--data-dir", "{tmp}/missing/data"), "--data-dir", "DS_DATA_DIR"),
    ],
)
def test_a_refused_start_names_the_setting_without_a_traceback(tmp_path, args, flag, env):
    a_file = tmp_path / "file"
    a_file.write_text("")
    args = tuple(a.format(file=a_file, tmp=tmp_path) for a in args)
    proc = start(tmp_path, free_port(), *args)
    assert_refused(proc, flag, env)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_stops_the_start_at_once_naming_the_port(tmp_path, workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        began = time.monotonic()
        proc = start(tmp_path, port, "--workers", workers)
        print(f"--workers {workers}: refused after {time.monotonic() - began:.1f} s")
    assert_refused(proc, f"--port {port}", "DS_PORT")
    assert "Address already in use" in proc.stderr, proc.stderr
    assert "recovery started" not in proc.stderr, proc.stderr  # refused before the app began


def test_a_writer_of_workers_starts_with_the_largest_head_allowed(server_factory):
    """The writer behind workers admits a little more head than its workers (what a
    relay adds); at the bound itself that room must not be refused as a setting."""
    srv = server_factory(
        "--workers", "2", "--max-header-bytes", str(checks.MAX_HEADER_BYTES)
    ).start()
    assert srv.stop() == 0, srv.log()
