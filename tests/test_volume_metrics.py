"""The data volume's inodes in /metrics (issue 15, finding 4).

Every stream has its own segment file, so a volume of many small streams
runs out of inodes while its free bytes look fine. The server exports the
volume's free and total inodes from ``statvfs`` at scrape time; here on a
small real ext4 filesystem (a loop mount, as root) with a known inode count,
the gauge follows the streams created.
"""

from __future__ import annotations

import os
import re
import subprocess

import httpx
import pytest

from testkit import needs

pytestmark = pytest.mark.processes

BIN = {"Content-Type": "application/octet-stream"}
STREAMS = 40


def gauges(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        name: float(value)
        for name, value in re.findall(r"^durable_streams_(disk_\w+) ([0-9.e+]+)$", text, re.M)
    }


def test_inodes_and_bytes_of_the_volume_are_exported(server_factory, tmp_path):
    srv = server_factory().start()
    g = gauges(srv.url)
    st = os.statvfs(srv.data_dir)
    assert g["disk_total_inodes"] == st.f_files
    assert g["disk_total_bytes"] == st.f_blocks * st.f_frsize
    if st.f_files:  # a filesystem with a fixed number of inodes
        assert 0 < g["disk_free_inodes"] <= st.f_files


def test_free_inodes_fall_with_every_stream_on_a_real_ext4_volume(server_factory, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (CI runs as root)")
    if needs.absent("mkfs.ext4"):
        needs.missing("mkfs.ext4 not installed: Debian's e2fsprogs (make system-deps)")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "16M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-N", "256", str(img)], check=True)
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount ext4 here: {mounted.stderr.strip()}")
    try:
        srv = server_factory(data_dir=mnt / "data").start()
        before = gauges(srv.url)
        assert before["disk_total_inodes"] == os.statvfs(mnt).f_files
        with httpx.Client(timeout=10) as c:
            for i in range(STREAMS):
                url = f"{srv.base}s{i}"
                assert c.put(url, headers=BIN).status_code == 201
                # Past what data format 5 keeps inline in LMDB: a file each.
                assert c.post(url, headers=BIN, content=b"x" * 2048).status_code == 204
        after = gauges(srv.url)
        assert after["disk_free_inodes"] <= before["disk_free_inodes"] - STREAMS
        assert after["disk_total_inodes"] == before["disk_total_inodes"]
        srv.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
