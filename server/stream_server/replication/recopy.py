"""The re-copy: a standby whose history frames cannot catch up takes the primary's
data whole (docs/replication.md, "Re-copy").

The primary's side builds a consistent snapshot of its data directory (a tar
file, ``engine.snapshot.build``) for a standby of its own set; the standby's side
downloads it off the event loop (its live readers and probes go on
meanwhile), stops, installs it in place of its data and execs itself again,
so that recovery starts from the copy. A failed download changes nothing:
the follower retries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from stream_server.engine.snapshot import build
from stream_server.fencing import restart_process
from stream_server.replication.identity import SetIdentity
from stream_server.replication.lease.roles import RoleLoop
from stream_server.replication.primary.shipping import Refusal
from stream_server.replication.role_switch import RoleSwitch
from stream_server.replication.standby import snapshot_install
from stream_server.replication.standby.receiver import Follower
from stream_server.streams.store import StreamStore

log = logging.getLogger("stream_server.replication")


class Recopy:
    def __init__(
        self,
        *,
        store: StreamStore,
        roles: RoleLoop,
        modes: RoleSwitch,
        follower: Follower,
        identity: SetIdentity,
        refusal: Callable[[str], Refusal | None],
        tls: Callable[[], ssl.SSLContext],
        auth: Callable[[], dict[str, str]],
    ) -> None:
        """``refusal``: the 409 for a replica of another set (``Replication.set_refusal``);
        ``tls`` and ``auth``: the context and headers of a request to a peer."""
        self.store = store
        self.roles = roles
        self.modes = modes
        self.follower = follower
        self.identity = identity
        self.refusal = refusal
        self.tls = tls
        self.auth = auth
        # What must stop before this process execs itself again: a writer's workers
        # (``workers/processes.py``), which would otherwise be left to its new image.
        self.before_restart: Callable[[], Awaitable[None]] | None = None

    async def serve(self, set_id: str = "") -> Path | Refusal | None:
        """A consistent copy of our data for a standby that must re-copy (a tar file
        the caller removes once sent); a 409 for another set's replica; None unless
        we are the primary."""
        if not self.modes.primary:
            return None
        refused = self.refusal(set_id)
        if refused is not None:
            return refused
        fd, name = tempfile.mkstemp(dir=self.store.engine.layout.root, prefix=".snapshot-")
        os.close(fd)
        out = Path(name)
        try:
            await asyncio.to_thread(build, self.store.engine, out)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(out.unlink, missing_ok=True))
            raise
        return out

    async def run(self, primary: str) -> None:
        """Replace our data with the primary's copy, then exec ourselves again: the
        first version of catching up when frames cannot do it (docs/replication.md)."""
        if self.modes.primary:
            return
        self.follower.following = False
        root = self.store.engine.layout.root
        tar = root / ".recopy.tar"
        log.warning("re-copying everything from the primary at %s", primary)
        try:
            await self._download_snapshot(primary, tar)
        except (httpx.HTTPError, RuntimeError, OSError) as exc:
            log.error("re-copy from %s failed, will retry: %s", primary, exc)
            await asyncio.to_thread(tar.unlink, missing_ok=True)
            self.follower.following = not self.modes.primary
            return
        if self.before_restart is not None:
            await self.before_restart()
        await self.roles.stop()
        await self.store.stop()
        await asyncio.to_thread(snapshot_install.install, root, tar)
        log.warning("re-copy installed: restarting to recover from it")
        restart_process()

    async def _download_snapshot(self, primary: str, tar: Path) -> None:
        """The primary's snapshot into ``tar``; the file is written off the event loop
        (a standby's live readers and probes go on meanwhile)."""
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(60.0), verify=self.tls()) as http,
            http.stream(
                "GET",
                f"{primary}/replication/snapshot",
                params={"set": self.identity.set_id},
                headers=self.auth(),
            ) as r,
        ):
            if r.status_code != 200:
                raise RuntimeError(f"the primary answered {r.status_code}")
            f = await asyncio.to_thread(tar.open, "wb")
            try:
                async for chunk in r.aiter_bytes():
                    await asyncio.to_thread(f.write, chunk)
            finally:
                await asyncio.to_thread(f.close)
