"""Webhook URL safety: the SSRF rules at configuration time and at delivery time."""

from __future__ import annotations

import argparse

import pytest

from stream_server.config import add_arguments, settings_from
from stream_server.subscriptions.urls import (
    WebhookAllowList,
    WebhookUrlRejected,
    check_webhook_url,
    check_webhook_url_resolving,
    resolve_checked,
)

NONE = WebhookAllowList.from_settings([])


@pytest.mark.parametrize(
    "url",
    [
        "https://worker.example/hooks",
        "https://worker.example:8443/hooks?x=1",
        "https://8.8.8.8/hook",
        "https://[2606:4700::1111]/hook",
        "http://localhost/hook",
        "http://localhost:3000/hook",
        "http://LOCALHOST./hook",
        "http://127.0.0.1:9999/webhook",  # the conformance suite's receiver
        "http://127.0.0.254/hook",
        "https://127.0.0.1/hook",
        "https://[::ffff:8.8.8.8]/hook",  # IPv4-mapped public address
        "https://[64:ff9b::808:808]/hook",  # NAT64 of a public address
    ],
)
def test_safe_urls_are_accepted(url):
    check_webhook_url(url, NONE)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.0.0.1/hook", "https://"),  # the suite's unsafe URL
        ("https://10.0.0.1/hook", "private"),
        ("https://172.16.5.4/hook", "private"),
        ("https://192.168.1.1/hook", "private"),
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://100.64.0.1/", "not a public"),  # carrier-grade NAT
        ("https://0.0.0.0/", "unspecified"),
        ("https://224.0.0.1/", "multicast"),
        ("https://240.0.0.1/", "reserved|private"),
        ("https://127.0.1.1/", "loopback"),  # loopback, but not 127.0.0.x
        ("https://[::1]/", "loopback"),
        ("https://[::]/", "unspecified"),
        ("https://[fe80::1]/", "link-local"),
        ("https://[fd12:3456::1]/", "unique local"),
        ("https://[::ffff:10.0.0.1]/", "private"),  # IPv4-mapped
        ("https://[::ffff:169.254.169.254]/", "link-local"),
        ("https://[2002:a00:1::1]/", "10.0.0.1"),  # 6to4 around 10.0.0.1
        ("https://[64:ff9b::a9fe:a9fe]/", "169.254.169.254"),  # NAT64
        ("https://[fe80::1%25eth0]/", "zone"),
        ("http://worker.example/hooks", "https://"),
        ("ftp://worker.example/", "https://"),
        ("file:///etc/passwd", "https://"),
        ("https://user:pw@worker.example/", "credentials"),
        ("https://127.0.0.1@10.0.0.1/", "credentials"),
        ("https://worker.example/#frag", "fragment"),
        ("https://worker.example:99999/", "not a valid URL"),
        ("https://worker.example:0/", "port"),
        ("https:///nohost", "no host"),
        ("https://worker example/", "whitespace"),
        ("https://worker.example\\@10.0.0.1/", "'\\\\'"),
        ("https://2130706433/", "non-standard"),  # 127.0.0.1 as one number
        ("https://0x7f.0.0.1/", "non-standard"),
        ("https://127.1/", "non-standard"),
        ("https://10.1/", "non-standard"),
        ("https://bad_-.example..com/", "not a valid host"),
        ("https://" + "a" * 64 + ".example/", "not a valid host"),
        ("https://x.example/" + "a" * 3000, "longer than"),
        ("", "non-empty"),
    ],
)
def test_unsafe_urls_are_refused_with_a_reason(url, reason):
    with pytest.raises(WebhookUrlRejected, match=reason) as info:
        check_webhook_url(url, NONE)
    assert info.value.code == "WEBHOOK_URL_REJECTED"


def test_the_allow_list_opens_chosen_cidrs_and_names():
    allow = WebhookAllowList.from_settings(
        ["10.0.0.0/8", " fd00::/8 ", "receiver.ns.svc", "*.hooks.internal", "192.168.7.7", ""]
    )
    check_webhook_url("https://10.1.2.3/hook", allow)
    check_webhook_url("http://10.1.2.3:8080/hook", allow)  # a listed host may use http
    check_webhook_url("https://[fd00::5]/hook", allow)
    check_webhook_url("https://[::ffff:10.0.0.1]/hook", allow)
    check_webhook_url("https://192.168.7.7/hook", allow)
    check_webhook_url("http://receiver.ns.svc:8080/hook", allow)
    check_webhook_url("http://RECEIVER.ns.svc./hook", allow)
    check_webhook_url("http://a.b.hooks.internal/hook", allow)
    with pytest.raises(WebhookUrlRejected, match="private"):
        check_webhook_url("https://192.168.7.8/hook", allow)
    with pytest.raises(WebhookUrlRejected, match="https://"):
        check_webhook_url("http://other.ns.svc/hook", allow)  # not listed: https only
    with pytest.raises(WebhookUrlRejected, match="https://"):
        check_webhook_url("http://hooks.internal/hook", allow)  # *. is below, not the name


@pytest.mark.parametrize("entry", ["10.0.0.1/8", "10.0.0.0/33", "bad host!", "*", "300.1.1.1"])
def test_a_malformed_allow_list_entry_is_refused_naming_it(entry):
    with pytest.raises(ValueError, match="allow-list entry"):
        WebhookAllowList.from_settings([entry])


def resolver_of(answers: dict[str, list[str]]):
    async def resolve(host: str, port: int) -> list[str]:
        if host not in answers:
            raise OSError(f"unknown host {host}")
        return answers[host]

    return resolve


async def test_localhost_resolves_through_the_system_and_passes():
    addresses = await resolve_checked("localhost", 80, NONE)
    assert addresses and all(a in ("::1",) or a.startswith("127.") for a in addresses)


async def test_a_name_that_resolves_to_a_private_address_is_refused_at_delivery():
    # The URL is fine on paper (https, a public-looking name); the answer is not.
    check_webhook_url("https://rebind.example/hook", NONE)
    resolve = resolver_of(
        {
            "rebind.example": ["10.0.0.5"],
            "loop.example": ["127.0.0.1"],
            "meta.example": ["169.254.169.254"],
            "mixed.example": ["93.184.215.14", "192.168.0.10"],
            "mapped.example": ["::ffff:127.0.0.1"],
            "public.example": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"],
        }
    )
    for name, why in [
        ("rebind.example", "10.0.0.5, which is a private address"),
        ("loop.example", "loopback"),  # only the name localhost has the dev exception
        ("meta.example", "link-local"),
        ("mixed.example", "192.168.0.10"),  # one bad answer refuses the name
        ("mapped.example", "127.0.0.1"),
    ]:
        with pytest.raises(WebhookUrlRejected, match=why):
            await resolve_checked(name, 443, NONE, resolver=resolve)
    assert await resolve_checked("public.example", 443, NONE, resolver=resolve) == [
        "93.184.215.14",
        "2606:2800:21f:cb07:6820:80da:af6b:8b2c",
    ]
    with pytest.raises(LookupError, match=r"nowhere\.example"):
        await resolve_checked("nowhere.example", 443, NONE, resolver=resolve)


async def test_allow_listed_names_and_cidrs_apply_at_delivery():
    resolve = resolver_of(
        {
            "receiver.ns.svc": ["10.96.4.2"],
            "elsewhere.example": ["10.3.3.3"],
            "multicast.ns.svc": ["224.0.0.5"],
        }
    )
    by_name = WebhookAllowList.from_settings(["receiver.ns.svc", "multicast.ns.svc"])
    assert await resolve_checked("receiver.ns.svc", 80, by_name, resolver=resolve) == ["10.96.4.2"]
    with pytest.raises(WebhookUrlRejected, match="not unicast"):
        await resolve_checked("multicast.ns.svc", 80, by_name, resolver=resolve)
    with pytest.raises(WebhookUrlRejected, match="private"):
        await resolve_checked("elsewhere.example", 443, by_name, resolver=resolve)
    by_cidr = WebhookAllowList.from_settings(["10.3.0.0/16"])
    assert await resolve_checked("elsewhere.example", 443, by_cidr, resolver=resolve) == [
        "10.3.3.3"
    ]


async def test_localhost_must_resolve_to_loopback_only():
    resolve = resolver_of({"localhost": ["127.0.0.1", "10.0.0.9"]})
    with pytest.raises(WebhookUrlRejected, match="not loopback"):
        await resolve_checked("localhost", 80, NONE, resolver=resolve)


async def test_configuration_time_check_resolves_but_tolerates_unknown_names():
    resolve = resolver_of({"internal.example": ["172.20.0.4"]})
    with pytest.raises(WebhookUrlRejected, match=r"172\.20\.0\.4"):
        await check_webhook_url_resolving("https://internal.example/h", NONE, resolver=resolve)
    # Not resolvable yet (receiver not deployed): accepted, delivery checks again.
    target = await check_webhook_url_resolving(
        "https://later.example:8443/h?a=b", NONE, resolver=resolve
    )
    assert (target.host, target.port, target.path, target.host_header) == (
        "later.example",
        8443,
        "/h?a=b",
        "later.example:8443",
    )


def settings(argv: list[str], env: dict[str, str]):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from(parser.parse_args(argv), env)


def test_the_allow_list_setting_takes_repeated_flags_or_a_comma_separated_variable():
    assert settings([], {}).webhook_allow == []
    s = settings([], {"DS_WEBHOOK_ALLOW": "10.0.0.0/8, receiver.ns.svc,,"})
    assert s.webhook_allow == ["10.0.0.0/8", "receiver.ns.svc"]
    s = settings(
        ["--webhook-allow", "fd00::/8", "--webhook-allow", "a.svc,b.svc"],
        {"DS_WEBHOOK_ALLOW": "10.0.0.0/8"},  # the flag wins
    )
    assert s.webhook_allow == ["fd00::/8", "a.svc", "b.svc"]
    assert (s.webhook_timeout, s.webhook_key_replay_window, s.webhook_key_rotation_interval) == (
        10.0,
        86400.0,
        0.0,
    )
    with pytest.raises(ValueError, match=r"allow-list entry '10\.0\.0\.1/8'"):
        settings(["--webhook-allow", "10.0.0.1/8"], {})
    with pytest.raises(ValueError, match="webhook-timeout must be positive"):
        settings(["--webhook-timeout", "0"], {})
