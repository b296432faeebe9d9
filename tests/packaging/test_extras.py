"""Each extra, installed alone in a fresh virtualenv, does its job and pulls in no other.

One distribution carries the server, the operator and the Spark reader; the
extras decide which dependencies come along. Here the project's wheel is
built once and installed four times, each into its own new virtualenv, the
way a user (or an image build) would: ``[server]`` serves, ``[operator]``
imports and renders, ``[spark]`` reads a data directory without the web
stack or the writer, and no extra at all gives a clear message, not a
traceback. This is slow-ish (pip, from its cache after the first run).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from testkit import free_port

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "golden-v1"

pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("durable_streams_py-*.whl")
    return found


def venv_with(tmp_path: Path, wheel: Path, extra: str) -> Path:
    """A fresh virtualenv with the project installed with ``extra`` ("" for none).

    The virtualenv gets no pip of its own: this interpreter's pip installs into it
    (``--python``), which skips the 4 s of bootstrapping one, and ``--no-compile``
    leaves the bytecode to the first import, which halves pyspark's install. The
    same distributions land in site-packages, pip's own aside."""
    env = tmp_path / f"venv-{extra or 'bare'}"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120
    )
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
         "-q", "--no-compile", "--disable-pip-version-check", spec],
        check=True,
        timeout=600,
    )  # fmt: skip
    return env


def run_python(env: Path, code: str) -> dict:
    proc = subprocess.run(
        [str(env / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_server_extra_alone_serves(tmp_path, wheel):
    env = venv_with(tmp_path, wheel, "server")
    port = free_port()
    proc = subprocess.Popen(
        [str(env / "bin" / "durable-streams-server"), "serve", "--port", str(port),
         "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        url = f"{base}/v1/stream/smoke"
        assert httpx.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
        assert httpx.post(url, headers={"Content-Type": "text/plain"}, content=b"hi").is_success
        assert httpx.get(url, params={"offset": "-1"}).content == b"hi"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_operator_extra_alone_imports_and_renders(tmp_path, wheel):
    env = venv_with(tmp_path, wheel, "operator")
    got = run_python(
        env,
        "import json, sys\n"
        "import stream_operator.controllers.handlers\n"
        "from stream_operator.specs.render import desired_objects\n"
        "from stream_operator.api.spec import with_defaults\n"
        "objs = desired_objects('events', 'default', 'uid-1', with_defaults({'replicas': 2}))\n"
        "heavy = [m for m in ('starlette', 'uvicorn', 'lmdb', 'pyspark', 'stream_server',"
        " 'stream_spark') if m in sys.modules]\n"
        "print(json.dumps({'kinds': sorted(o['kind'] for o in objs), 'heavy': heavy}))",
    )
    assert "StatefulSet" in got["kinds"] and "Service" in got["kinds"]
    assert got["heavy"] == []


def test_the_spark_extra_alone_reads_a_data_directory(tmp_path, wheel):
    env = venv_with(tmp_path, wheel, "spark")
    got = run_python(
        env,
        "import json, sys\n"
        "from stream_spark._plan import Selection, batch_ranges, plan\n"
        "from stream_spark._reader import MetaReader, read_slice\n"
        f"d = {str(GOLDEN)!r}\n"
        "n = {}\n"
        "with MetaReader(d) as meta:\n"
        "    cut = meta.cut()\n"
        "    for part in plan(cut, meta, batch_ranges(cut, Selection())):\n"
        "        for sl in part:\n"
        "            n[sl.stream] = n.get(sl.stream, 0) + sum(len(r.payload)"
        " for r in read_slice(d, sl))\n"
        "heavy = [m for m in ('starlette', 'uvicorn', 'stream_server', 'stream_operator',"
        " 'kopf') if m in sys.modules]\n"
        "print(json.dumps({'bytes': n, 'heavy': heavy}))",
    )
    assert got["bytes"]["bin/a"] == 11 and got["bytes"]["bin/big"] == 61440
    assert got["heavy"] == []


def test_no_extra_names_the_one_to_install(tmp_path, wheel):
    env = venv_with(tmp_path, wheel, "")
    proc = subprocess.run(
        [str(env / "bin" / "durable-streams-server"), "serve", "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "pip install 'durable-streams-py[server]'" in proc.stderr
    assert "Traceback" not in proc.stderr
