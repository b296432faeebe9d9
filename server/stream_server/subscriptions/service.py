"""Subscriptions as one part of the server: built from settings, started and stopped with it.

The app builds one ``Subscriptions`` next to the store, wires the store's
hooks to its manager, starts it once recovery has finished (the records are
read from the recovered store) and stops it first on shutdown, so no
delivery is in flight when the store closes. The signing key ring is
opened at start, off the event loop (it may create and fsync a key).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream_server.metrics import Metrics
from stream_server.subscriptions.delivery import DeliveryLoop
from stream_server.subscriptions.manager import SubscriptionManager
from stream_server.subscriptions.model import Subscription
from stream_server.subscriptions.sender import WebhookSender
from stream_server.subscriptions.signing import KEYRING_DIR, WebhookKeys
from stream_server.subscriptions.urls import WebhookAllowList

log = logging.getLogger("stream_server.subscriptions")


@dataclass
class SubscriptionSettings:
    data_dir: Path
    base_path: str = "/v1/stream/"
    public_url: str = ""
    max_path_bytes: int = 1024
    max_subscriptions: int = 10_000
    webhook_allow: tuple[str, ...] = ()
    webhook_timeout: float = 10.0
    webhook_ca_file: str = ""
    webhook_key_replay_window: float = 24 * 3600.0
    webhook_key_rotation_interval: float = 0.0


class Subscriptions:
    def __init__(self, store: Any, settings: SubscriptionSettings, metrics: Metrics | None) -> None:
        self.settings = settings
        self.allow = WebhookAllowList.from_settings(settings.webhook_allow)
        self.manager = SubscriptionManager(
            store,
            max_path_bytes=settings.max_path_bytes,
            max_subscriptions=settings.max_subscriptions,
            metrics=metrics,
        )
        self.keys: WebhookKeys | None = None
        self.loop: DeliveryLoop | None = None
        self.public_url = settings.public_url.rstrip("/")

    @property
    def started(self) -> bool:
        return self.loop is not None

    async def start(self) -> None:
        s = self.settings
        self.keys = await asyncio.to_thread(
            WebhookKeys.load_or_create,
            s.data_dir / KEYRING_DIR,
            replay_window=s.webhook_key_replay_window,
        )
        verify: ssl.SSLContext | bool = True
        if s.webhook_ca_file:
            verify = ssl.create_default_context(cafile=s.webhook_ca_file)
        sender = WebhookSender(self.keys, self.allow, s.webhook_timeout, verify=verify)
        await self.manager.load()
        self.loop = DeliveryLoop(
            self.manager,
            sender,
            callback_url=self.callback_url,
            keys=self.keys,
            key_rotation_interval=s.webhook_key_rotation_interval,
        )
        self.loop.start()

    async def stop(self) -> None:
        if self.loop is not None:
            await self.loop.stop()
            self.loop = None

    # ------------------------------------------------------------------ URLs

    def origin(self, request_origin: str) -> str:
        return self.public_url or request_origin

    def url(self, origin: str, rest: str) -> str:
        return f"{self.origin(origin)}{self.settings.base_path}__ds/{rest}"

    def callback_url(self, sub: Subscription) -> str:
        return self.url(sub.origin, f"subscriptions/{sub.id}/callback")

    def signing(self, origin: str) -> dict[str, str] | None:
        if self.keys is None:
            return None
        return {"alg": "ed25519", "kid": self.keys.kid, "jwks_url": self.url(origin, "jwks.json")}
