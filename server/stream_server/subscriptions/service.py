"""Subscriptions as one part of the server: built from settings, started and stopped with it.

The app builds one ``Subscriptions`` next to the store, wires the store's
hooks to its manager, starts it once recovery has finished (the saved
subscriptions are read from the recovered store) and stops it first on
shutdown, so no delivery is in flight when the store closes. The signing key ring is
opened at start, off the event loop (it may create and fsync a key).

In a replica set (``primary_only``) delivery runs only on the primary: the
replication service calls ``resume`` on promotion (the saved subscriptions
arrived in replicated frames, so delivery continues from the old primary's
cursors) and ``pause`` on demotion, before the replica follows. A standby still answers
reads of the control API, from a read-only copy of the replicated
subscriptions.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

from stream_server.declared.groups import SubscriptionSettings
from stream_server.metrics import Metrics
from stream_server.streams.clock import WALL_CLOCK, Clock
from stream_server.streams.interface import SubscriptionStore
from stream_server.subscriptions.delivery import DeliveryLoop
from stream_server.subscriptions.manager import SubscriptionManager
from stream_server.subscriptions.signing import KEYRING_DIR, WebhookKeys
from stream_server.subscriptions.state import Subscription
from stream_server.subscriptions.subscription_errors import SubscriptionError
from stream_server.subscriptions.urls import WebhookAllowList
from stream_server.subscriptions.webhook_sender import WebhookSender

log = logging.getLogger("stream_server.subscriptions")


class Subscriptions:
    def __init__(
        self,
        store: SubscriptionStore,
        settings: SubscriptionSettings,
        metrics: Metrics | None,
        *,
        data_dir: Path,
        base_path: str,
        max_path_bytes: int,
        clock: Clock = WALL_CLOCK,
        primary_only: bool = False,
    ) -> None:
        """``settings``: the subscriptions' group; the data directory (the key ring's),
        the base path (of callback and JWKS URLs) and the path limit are the node's."""
        self.settings = settings
        self.data_dir = data_dir
        self.base_path = base_path
        self.max_path_bytes = max_path_bytes
        self.store = store
        self.clock = clock  # leases, retries, tombstones and key ages
        self.allow = WebhookAllowList.from_settings(settings.webhook_allow)
        self.manager = SubscriptionManager(
            store,
            max_path_bytes=max_path_bytes,
            max_subscriptions=settings.max_subscriptions,
            metrics=metrics,
            clock=clock,
        )
        self.keys: WebhookKeys | None = None
        self.loop: DeliveryLoop | None = None
        self.public_url = settings.public_url.rstrip("/")
        # In a replica set: deliver only between resume and pause (the replication's
        # primary work).
        self.primary_only = primary_only
        self._switch = asyncio.Lock()
        self._view: tuple[object, SubscriptionManager] | None = None  # (store version, copy)

    @property
    def started(self) -> bool:
        """Whether control requests are answered (delivering, or a standby's reads)."""
        return self.loop is not None or (self.primary_only and self.keys is not None)

    async def start(self) -> None:
        """Open the key ring, then deliver, unless only a primary may (``resume``)."""
        async with self._switch:
            await self._open_keys()
        if not self.primary_only:
            await self.resume()

    async def _open_keys(self) -> WebhookKeys:
        if self.keys is None:
            s = self.settings
            self.keys = await asyncio.to_thread(
                WebhookKeys.load_or_create,
                self.data_dir / KEYRING_DIR,
                replay_window=s.webhook_key_replay_window,
                clock=self.clock,
            )
        return self.keys

    async def resume(self) -> None:
        """Load every saved subscription afresh and deliver what is pending (start, or promotion)."""
        async with self._switch:
            if self.loop is not None:
                return
            s = self.settings
            keys = await self._open_keys()
            verify: ssl.SSLContext | bool = True
            if s.webhook_ca_file:
                verify = ssl.create_default_context(cafile=s.webhook_ca_file)
            sender = WebhookSender(keys, self.allow, s.webhook_timeout, verify=verify)
            self.manager.reset()
            try:
                await self.manager.load()
            except BaseException:
                await sender.aclose()
                raise
            self.loop = DeliveryLoop(
                self.manager,
                sender,
                callback_url=self.callback_url,
                keys=keys,
                key_rotation_interval=s.webhook_key_rotation_interval,
            )
            self.loop.start()

    async def pause(self) -> None:
        """Stop delivering (demotion, or shutdown): nothing in flight once it returns."""
        async with self._switch:
            if self.loop is not None:
                await self.loop.stop()
                self.loop = None
            if self.primary_only:
                self.manager.reset()  # a standby's copy is ``control``'s, read afresh

    async def stop(self) -> None:
        await self.pause()

    async def control(self, *, writing: bool) -> SubscriptionManager:
        """The manager that answers control requests: the live one while delivering,
        else a read-only copy of the replicated subscriptions, read again whenever the
        store changed since (a standby). Writes reach a replica that does not deliver
        only while it is being promoted (app.py refuses them on a standby): they wait
        for ``resume``, which would not see them."""
        if self.loop is not None or not self.primary_only:
            return self.manager
        if writing:
            raise SubscriptionError(
                "UNAVAILABLE", "subscriptions are starting here", headers={"retry-after": "1"}
            )
        version = self.store.version
        if self._view is None or self._view[0] != version:
            view = SubscriptionManager(
                self.store,
                max_path_bytes=self.max_path_bytes,
                max_subscriptions=self.settings.max_subscriptions,
                clock=self.clock,
            )
            await view.load(prune=False)
            self._view = (version, view)
        return self._view[1]

    # ------------------------------------------------------------------ URLs

    def origin(self, request_origin: str) -> str:
        return self.public_url or request_origin

    def url(self, origin: str, rest: str) -> str:
        return f"{self.origin(origin)}{self.base_path}__ds/{rest}"

    def callback_url(self, sub: Subscription) -> str:
        return self.url(sub.origin, f"subscriptions/{sub.id}/callback")

    def signing(self, origin: str) -> dict[str, str] | None:
        if self.keys is None:
            return None
        return {"alg": "ed25519", "kid": self.keys.kid, "jwks_url": self.url(origin, "jwks.json")}
