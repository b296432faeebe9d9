"""The settings of one concern each, declared once: the part that reads a group
receives it as it is (the server's ``Settings`` inherits every group, so that it is
one), and no class restates a field.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_server.declared import checks
from stream_server.declared.about import Group, setting, setting_list

COUNT = checks.whole(1)
NONE_OR_MORE = checks.whole(0)
SECONDS = checks.seconds()
SECONDS_OR_ZERO = checks.seconds(positive=False)
FILE = checks.readable_file


@dataclass
class SubscriptionSettings:
    """Webhooks that wake consumers when streams change (``subscriptions/``)."""

    public_url: str = setting(
        "",
        Group.SUBSCRIPTIONS,
        "the server's URL as webhook receivers reach it, e.g. https://streams.example (callback "
        "and JWKS URLs; empty: the scheme and Host of the request that created the subscription)",
        checks.http_url,
    )
    max_subscriptions: int = setting(
        10_000, Group.SUBSCRIPTIONS, "most subscriptions the server holds (more: 503)", COUNT
    )
    webhook_allow: list[str] = setting_list(  # noqa: RUF009 - a field(default_factory=list)
        Group.SUBSCRIPTIONS,
        "CIDR or host name (*.suffix for a domain) that webhooks may target although private, e.g."
        " 10.0.0.0/8 or receiver.ns.svc; repeat the flag; listed hosts may also use http://",
    )
    webhook_timeout: float = setting(
        10.0,
        Group.SUBSCRIPTIONS,
        "seconds one webhook delivery may take in all (DNS, connect, response)",
        SECONDS,
        unit="s",
    )
    webhook_ca_file: str = setting(
        "",
        Group.SUBSCRIPTIONS,
        "PEM bundle of CAs to trust for https:// webhooks (empty: the public CAs)",
        checks.ca_bundle,
    )
    webhook_key_replay_window: float = setting(
        24 * 3600.0,
        Group.SUBSCRIPTIONS,
        "seconds a rotated-out webhook signing key stays in the JWKS",
        SECONDS_OR_ZERO,
        unit="s",
    )
    webhook_key_rotation_interval: float = setting(
        0.0,
        Group.SUBSCRIPTIONS,
        "seconds after which the server makes a new webhook signing key (0: only by "
        "`durable-streams-server rotate-webhook-key`)",
        SECONDS_OR_ZERO,
        unit="s",
    )
