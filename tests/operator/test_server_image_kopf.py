"""Issue 25: the operator-wide setting for DurableStreams that pin no server image, under
the real kopf operator against the emulated API server, across an operator "upgrade":
the operator stopped and started again with another ``DS_OPERATOR_SERVER_IMAGE``."""

from __future__ import annotations

from typing import Any

import pytest

from stream_operator import KIND
from stream_operator.api.spec import SERVER_IMAGE_ENV
from stream_operator.decisions.server_image import IN_USE, POLICY_ENV, UPDATE_NOW
from testkit import wait_for
from testkit.cluster import Cluster, cluster
from testkit.kube import durable_stream
from testkit.operator import running_operator

pytestmark = pytest.mark.slow

NS = "default"


def image(c: Cluster, name: str) -> str:
    sts = c.get("StatefulSet", NS, name) or {}
    return sts["spec"]["template"]["spec"]["containers"][0]["image"] if sts else ""


def status_of(c: Cluster, name: str) -> dict[str, Any]:
    return (c.get(KIND, NS, name) or {}).get("status") or {}


def events(c: Cluster, name: str, reason: str) -> list[str]:
    return [
        e["message"]
        for e in c.list("Event", NS)
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def every_event(c: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in c.list("Event", NS) if e["involvedObject"]["name"] == name]


def upgrade_the_operator(c: Cluster, monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    """Three DurableStreams made by an operator whose server image is ds:1 (one pins
    its own), then that operator replaced by one whose server image is ds:2."""
    monkeypatch.setenv(POLICY_ENV, setting)
    monkeypatch.setenv(SERVER_IMAGE_ENV, "ds:1")
    with running_operator(c):
        for name, spec in (("a", {}), ("b", {}), ("pinned", {"image": "mine:7"})):
            c.create(durable_stream(name, {"storage": {"size": "1Gi"}, **spec}))
        for name, want in (("a", "ds:1"), ("b", "ds:1"), ("pinned", "mine:7")):
            wait_for(lambda n=name, w=want: status_of(c, n).get("image") == w, message=name)
    monkeypatch.setenv(SERVER_IMAGE_ENV, "ds:2")


def test_hold_keeps_each_server_on_its_image_until_its_spec_changes_or_its_owner_asks(
    monkeypatch: pytest.MonkeyPatch,
):
    with cluster() as c:
        upgrade_the_operator(c, monkeypatch, "hold")
        with running_operator(c):
            for name in ("a", "b"):
                wait_for(
                    lambda n=name: status_of(c, n).get("imageUpdateAvailable") == "ds:2",
                    message=f"{name}: the update named as available",
                )
                assert image(c, name) == "ds:1"  # held: no rolling restart
                # Its Event comes with the status round that wrote it: wait for it.
                told = wait_for(
                    lambda n=name: events(c, n, "ServerImageUpdateAvailable"),
                    message=lambda n=name: (
                        f"{n}: the ServerImageUpdateAvailable Event; its Events: "
                        f"{[(e['reason'], e['message']) for e in every_event(c, n)]}"
                    ),
                )
                assert len(told) == 1 and told[0].endswith(
                    f"kubectl annotate dstream {name} {UPDATE_NOW}=now"
                )
            assert image(c, "pinned") == "mine:7"
            assert status_of(c, "pinned")["imageUpdateAvailable"] == ""
            record = c.get("StatefulSet", NS, "a")["metadata"]["annotations"][IN_USE]
            assert '"image": "ds:1"' in record
            # The owner of a asks; b's spec changes: each takes ds:2, and says so.
            body = {"metadata": {"annotations": {UPDATE_NOW: "now"}}}
            c.patch(KIND, NS, "a", body).raise_for_status()
            c.patch(KIND, NS, "b", {"spec": {"server": {"logLevel": "debug"}}})
            for name in ("a", "b"):
                wait_for(lambda n=name: image(c, n) == "ds:2", message=f"{name} on ds:2")
                wait_for(
                    lambda n=name: status_of(c, n).get("imageUpdateAvailable") == "",
                    message=f"{name}: nothing held back",
                )
            notes = c.get(KIND, NS, "a")["metadata"].get("annotations") or {}
            assert UPDATE_NOW not in notes  # done, so removed
        # The next upgrade holds what a took (its record), as it held ds:1.
        monkeypatch.setenv(SERVER_IMAGE_ENV, "ds:3")
        with running_operator(c):
            wait_for(
                lambda: status_of(c, "a").get("imageUpdateAvailable") == "ds:3",
                message="a: ds:3 named as available",
            )
            assert image(c, "a") == "ds:2"


def test_roll_moves_every_unpinned_server_to_the_new_operators_image(
    monkeypatch: pytest.MonkeyPatch,
):
    with cluster() as c:
        upgrade_the_operator(c, monkeypatch, "roll")
        with running_operator(c):
            for name in ("a", "b"):
                wait_for(lambda n=name: image(c, n) == "ds:2", message=f"{name} on ds:2")
            assert image(c, "pinned") == "mine:7"
            assert all(status_of(c, n).get("imageUpdateAvailable") == "" for n in ("a", "b"))
            assert events(c, "a", "ServerImageUpdateAvailable") == []
