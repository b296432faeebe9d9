"""A real Ceph RADOS Gateway for the tests (``ARCHIVE_STORE=ceph``, ``make test-long``).

One ``ceph-mon``, one ``ceph-osd`` (bluestore on a sparse file) and ``radosgw``
(the beast frontend), plain processes from a generated ``ceph.conf`` on loopback
(the shape of Ceph's vstart.sh), with no cephx (``auth_*_required = none``) and
no mgr; then a gateway user with the test's keys. The settings are the ones that
worked here (../shared/TOOLING-NOTES.md, "S3-compatible object stores"): without
``ms_mon_client_mode = crc`` in the gateway's section it retries forever with
``get_initial_auth_request returned -13``; ``mon_data_avail_crit = 0`` keeps the
mon up on a fuller disk; ``paxos_propose_interval = 0.1`` makes pool creation take
a second instead of nine. Debian's packages (``radosgw ceph-mon ceph-osd
ceph-common``, scripts/system-deps.sh with ``LONG=1``) provide the programs.

Same interface as ``testkit.seaweedfs.SeaweedFS``: ``endpoint``, ``env()``,
``new_bucket()``, ``start``, ``stop`` (SIGTERM; the data stays), ``kill``
(kill -9 of the three; the data stays), ``close``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from testkit import needs, wait_for
from testkit.s3_keys import S3Keys
from testkit.servers import free_port

ACCESS_KEY = "ceph-test-access-key"
SECRET_KEY = "ceph-test-secret-key-0123456789"
PROGRAMS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
OSD_BYTES = 8 * 1024**3  # the sparse block file: only what is written takes space


def ceph_programs() -> None:
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        needs.missing(
            f"{', '.join(missing)} not installed (apt-get install radosgw ceph-mon ceph-osd "
            "ceph-common: scripts/system-deps.sh with LONG=1)"
        )


def ceph_conf(root: Path, fsid: str, mon_port: int, rgw_port: int) -> str:
    return f"""[global]
fsid = {fsid}
mon_host = [v2:127.0.0.1:{mon_port}]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_msgr2 = true
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
auth_allow_insecure_global_id_reclaim = true
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
paxos_propose_interval = 0.1
osd_client_watch_timeout = 5
mon_data_avail_crit = 0
mon_data_avail_warn = 0
run_dir = {root}/run
admin_socket = {root}/run/$name.asok
log_file = {root}/log/$name.log
pid_file = {root}/run/$name.pid
keyring = {root}/keyring
crash_dir = {root}/crash
[mon.a]
mon_data = {root}/mon.a
[osd]
osd_data = {root}/osd.$id
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = {OSD_BYTES}
osd_max_object_name_len = 460
osd_max_object_namespace_len = 64
[client.rgw]
rgw_frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw_data = {root}/rgw
rgw_dns_name = 127.0.0.1
auth_client_required = none
ms_mon_client_mode = crc
rgw_enable_usage_log = false
"""


class CephRGW(S3Keys):
    """A one-OSD Ceph cluster and its gateway, in a directory of its own."""

    access_key = ACCESS_KEY
    secret_key = SECRET_KEY

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="ceph-"))
        self.conf = self.root / "ceph.conf"
        self.mon_port = free_port()
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.made = False
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -------------------------------------------------------------- processes

    def _run(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            args, capture_output=True, timeout=timeout, cwd=self.root, env=self._ceph_env()
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} exited {done.returncode}: {done.stderr.decode()[-2000:]}"
            )
        return done.stdout.decode()

    def _ceph_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CEPH_"))}

    def _daemon(self, name: str, *args: str) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        with log:
            self.procs[name] = subprocess.Popen(
                [*args, "-f", "-c", str(self.conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=self._ceph_env(),
                start_new_session=True,
            )

    def _make(self) -> None:
        """A new cluster: the mon's store, the OSD's bluestore, the conf."""
        for d in ("run", "log", "mon.a", "osd.0", "rgw", "crash"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        fsid = str(uuid.uuid4())
        self.conf.write_text(ceph_conf(self.root, fsid, self.mon_port, self.port))
        monmap = str(self.root / "monmap")
        self._run(
            "monmaptool",
            "--create",
            "--clobber",
            "--addv",
            "a",
            f"[v2:127.0.0.1:{self.mon_port}]",
            "--fsid",
            fsid,
            monmap,
        )
        self._run("ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a", "--monmap", monmap)
        self._daemon("mon.a", "ceph-mon", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._ceph("osd", "new", osd_uuid).strip()
        self._run("ceph-osd", "-c", str(self.conf), "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self.made = True

    def _ceph(self, *args: str) -> str:
        return self._run("ceph", "-c", str(self.conf), "--connect-timeout", "30", *args)

    def start(self) -> None:
        ceph_programs()
        self.starts += 1
        if not self.made:
            self._make()
        else:
            self._daemon("mon.a", "ceph-mon", "-i", "a")
        self._daemon("osd.0", "ceph-osd", "-i", "0")
        self._daemon("rgw", "radosgw", "-n", "client.rgw")
        wait_for(self._answers, timeout=120, message=self._why)
        self._user()

    def _why(self) -> str:
        logs = sorted((self.root / "log").glob("*"))
        tails = [f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in logs]
        return "the RADOS gateway to serve S3\n" + "\n".join(tails)

    def _answers(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}: {self._why()}")
        try:
            self._admin_client().list_buckets()
        except Exception as exc:  # not up yet (connection refused, no user yet), whatever the error
            return "InvalidAccessKeyId" in str(exc)  # serving: the user is made next
        return True

    def _user(self) -> None:
        try:
            self._run("radosgw-admin", "-c", str(self.conf), "-n", "client.rgw",
                      "user", "info", "--uid", "test")  # fmt: skip
        except RuntimeError:
            self._run(
                "radosgw-admin",
                "-c",
                str(self.conf),
                "-n",
                "client.rgw",
                "user",
                "create",
                "--uid",
                "test",
                "--display-name",
                "test",
                "--access-key",
                ACCESS_KEY,
                "--secret-key",
                SECRET_KEY,
            )
        wait_for(self._served, timeout=120, message=self._why)

    def _served(self) -> bool:
        """A new bucket and a write go through: the user is known, and after a kill -9
        the OSD's placement groups are active again and the dead gateway's watches have
        timed out (``osd_client_watch_timeout``: until then a bucket's creation waits
        for it, 30 s by default, while listing answers at once)."""
        client, bucket = self.client(), f"ready-{self.starts}"
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="probe", Body=b"x")
        except Exception:  # not yet, whatever the error
            return False
        return True

    def _admin_client(self) -> Any:
        return self.client()

    # -------------------------------------------------------------- stopping

    def stop(self) -> None:
        """SIGTERM to the gateway, the OSD, then the mon, each waited for (the data stays)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """kill -9 of all three (the data stays: bluestore and the mon's store recover)."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        for name in ("rgw", "osd.0", "mon.a"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        """``ceph status`` as JSON (for a failure's message)."""
        return dict(json.loads(self._ceph("status", "--format", "json")))
