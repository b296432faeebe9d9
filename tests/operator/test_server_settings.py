"""What the operator renders for spec.server, read by a real server process.

The operator may not import the server (import-linter), so nothing but a
server started with the ConfigMap's env can say that the rendered variables
mean what the CRD promises: the retention policies are in force, the
allow-list opens exactly the listed receivers, and callback URLs carry the
public URL.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from stream_operator.specs.render import render_configmap

pytestmark = pytest.mark.processes

SPEC: dict[str, Any] = {
    "server": {
        "subscriptions": {
            "webhookAllow": ["receiver.jobs.svc", "10.244.0.0/16"],
            "publicURL": "http://events.default.svc:4437",
        },
        "retention": [
            {"prefix": "logs/", "maxBytes": "10Gi", "maxAge": "7d"},
            {"prefix": "metrics/", "maxAge": "12h"},
            {"prefix": "", "maxBytes": "512Ki"},
        ],
    }
}


def pod_env(spec: dict[str, Any]) -> dict[str, str]:
    """The ConfigMap's data as the pod's environment, on the test's loopback address (the
    test's own port and data directory come as flags, which win over the variables)."""
    env = dict(render_configmap("events", "default", "uid", spec)["data"])
    env["DS_HOST"] = "127.0.0.1"
    return env


def test_a_server_runs_with_the_rendered_subscriptions_and_retention(server_factory):
    srv = server_factory(env=pod_env(SPEC)).start()
    metrics = httpx.get(f"{srv.url}/metrics").text
    for prefix in ("logs/", "metrics/", ""):
        assert f'durable_streams_retention_retained_bytes{{policy="{prefix}"}}' in metrics

    def subscribe(sub_id: str, url: str) -> httpx.Response:
        body = {"type": "webhook", "pattern": "events/*", "webhook": {"url": url}}
        return httpx.put(f"{srv.base}__ds/subscriptions/{sub_id}", json=body)

    # A private receiver the allow-list names, by name and over http://: accepted.
    assert subscribe("listed", "http://receiver.jobs.svc:8080/hook").status_code == 201
    refused = subscribe("unlisted", "http://other.jobs.svc:8080/hook")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "WEBHOOK_URL_REJECTED"
    # Callback and JWKS URLs start with the public URL, not with the request's origin.
    sub = httpx.get(f"{srv.base}__ds/subscriptions/listed").json()
    assert sub["webhook"]["signing"]["jwks_url"] == (
        "http://events.default.svc:4437/v1/stream/__ds/jwks.json"
    )


def test_an_allow_list_entry_past_the_schema_stops_the_server_with_its_name(server_factory):
    """The CRD's patterns are a first filter; the server still checks each entry exactly
    (a CIDR with host bits set) and refuses to start, naming it, with exit status 2."""
    spec = {"server": {"subscriptions": {"webhookAllow": ["10.0.0.1/8"]}}}
    srv = server_factory(env=pod_env(spec))
    with pytest.raises(RuntimeError, match="exited with 2"):
        srv.start()
    assert "10.0.0.1/8" in srv.log()


def test_a_server_runs_with_the_settings_map_in_force(server_factory):
    """spec.server.settings reaches the server by its variables: its limit holds."""
    spec = {"server": {"settings": {"max-streams": 1, "metrics": False}}}
    srv = server_factory(env=pod_env(spec)).start()
    assert httpx.put(f"{srv.base}first").status_code == 201
    assert httpx.put(f"{srv.base}second").status_code == 503
    assert httpx.get(f"{srv.url}/metrics").status_code == 404
