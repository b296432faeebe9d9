"""What a DurableStream spec becomes (pure functions, no cluster)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_operator import GROUP
from stream_operator.api.quantities import as_bytes as quantity_bytes
from stream_operator.api.spec import StorageSpec, refused_change, with_defaults
from stream_operator.specs import analytics as spark
from stream_operator.specs import spark_manifests
from stream_operator.specs.render import (
    CONFIG_HASH,
    config_hash,
    desired_objects,
    endpoint,
    render_configmap,
    render_statefulset,
    server_env,
)

UID = "1234-uid"


def test_defaults_fill_a_bare_spec():
    s = with_defaults({})
    assert s.replicas == 1 and not s.replicated and s.min_in_sync == 1
    assert s.storage == StorageSpec(size="10Gi", pvc_retention="Retain", storage_class_name=None)
    assert s.raw["storage"] == {"size": "10Gi", "pvcRetention": "Retain"}  # what is hashed
    debug = with_defaults({"server": {"logLevel": "debug"}}).server
    assert debug.log_level == "debug" and debug.long_poll_timeout_seconds == 30


def test_a_spec_is_parsed_once_and_the_input_is_left_as_it_was():
    raw = {"replicas": 3, "server": {"rateLimit": {"requestsPerSecond": 5}}}
    s = with_defaults(raw)
    assert with_defaults(s) is s  # a parsed spec passes through every renderer as it is
    assert raw == {"replicas": 3, "server": {"rateLimit": {"requestsPerSecond": 5}}}
    assert s.replicated and s.min_in_sync == 2
    assert s.server.rate_limit is not None and s.server.rate_limit.burst == 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.replicas = 1  # type: ignore[misc]
    assert s.changed(replicas=5).min_in_sync == 3 and s.replicas == 3


def test_objects_and_owner_references():
    objs = desired_objects("ev", "ns", UID, {})
    assert [o["kind"] for o in objs] == [
        "ConfigMap",
        "Service",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
        "NetworkPolicy",  # on by default (spec.networkPolicy.enabled)
    ]
    for o in objs:
        ref = o["metadata"]["ownerReferences"][0]
        assert ref == {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "DurableStream",
            "name": "ev",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert o["metadata"]["namespace"] == "ns"
    headless = objs[1]
    assert headless["metadata"]["name"] == "ev-headless" and headless["spec"]["clusterIP"] == "None"


def test_statefulset_runs_the_server_as_configured():
    spec = {
        "image": "registry/ds:1.2",
        "replicas": 3,
        "storage": {"size": "5Gi", "storageClassName": "fast", "pvcRetention": "Delete"},
        "server": {
            "longPollTimeoutSeconds": 12,
            "authTokensSecret": {"name": "tokens"},
            "tlsSecretName": "certs",
        },
        "scheduling": {"nodeSelector": {"disk": "ssd"}},
    }
    sts = render_statefulset("ev", "ns", UID, spec)
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry/ds:1.2" and c["args"] == ["serve"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert pod["nodeSelector"] == {"disk": "ssd"}
    assert sts["spec"]["replicas"] == 3
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast"
    assert claim["resources"]["requests"]["storage"] == "5Gi"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    # A replica set also mounts its peer token (tests/operator/test_replica_set_render.py).
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "podinfo", "auth", "tls", "replication"}
    env = server_env(spec)
    assert env["DS_HOST"] == "::" and env["DS_DATA_DIR"] == "/data"
    assert env["DS_LONG_POLL_TIMEOUT"] == "12"
    assert env["DS_AUTH_TOKENS_FILE"].endswith("tokens.json")
    assert env["DS_TLS_CERT"].endswith("tls.crt")
    assert endpoint("ev", "ns", spec) == "https://ev.ns.svc:4437/v1/stream/"


def test_config_hash_rolls_pods_only_for_pod_changes():
    base = {"replicas": 1, "storage": {"size": "1Gi"}}
    h = config_hash(base)
    assert config_hash({**base, "replicas": 5}) != h  # single node -> replica set
    three = config_hash({**base, "replicas": 3})
    assert config_hash({**base, "replicas": 4}) != three  # the majority moves: 2 -> 3
    assert config_hash({**base, "replicas": 5}) == config_hash({**base, "replicas": 4})
    pinned = {**base, "replication": {"minInSync": 2}}
    assert config_hash({**pinned, "replicas": 3}) == config_hash({**pinned, "replicas": 5})
    assert config_hash({**base, "storage": {"size": "2Gi"}}) == h  # growth goes to the PVCs
    assert config_hash({**base, "image": "x:2"}) != h
    assert config_hash({**base, "server": {"logLevel": "debug"}}) != h
    assert config_hash({**base, "resources": {"limits": {"memory": "2Gi"}}}) != h
    sts = render_statefulset("a", "n", UID, {**base, "image": "x:2"})
    assert sts["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH] == config_hash(
        {**base, "image": "x:2"}
    )


@pytest.mark.parametrize(
    ("text", "n"),
    [("1Gi", 2**30), ("500Mi", 500 * 2**20), ("2G", 2 * 10**9), ("1.5Ti", int(1.5 * 2**40))],
)
def test_quantities(text, n):
    assert quantity_bytes(text) == n


def test_refused_changes():
    old = {"storage": {"size": "10Gi", "storageClassName": "fast"}}
    assert refused_change(None, old) is None
    assert refused_change(old, {"storage": {"size": "20Gi", "storageClassName": "fast"}}) is None
    assert "shrink" in refused_change(old, {"storage": {"size": "5Gi", "storageClassName": "fast"}})
    assert "storageClassName" in refused_change(
        old, {"storage": {"size": "10Gi", "storageClassName": "slow"}}
    )


def test_lifecycle_sets_the_probes_and_the_grace_period():
    """Issue 15, finding 7: probe timings and the grace period come from spec.lifecycle."""
    pod = render_statefulset("ev", "ns", UID, {})["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 30
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 300
    life = {
        "startupTimeoutSeconds": 1801,
        "terminationGracePeriodSeconds": 120,
        "readinessPeriodSeconds": 2,
        "readinessFailureThreshold": 3,
        "livenessPeriodSeconds": 20,
        "livenessFailureThreshold": 4,
    }
    pod = render_statefulset("ev", "ns", UID, {"lifecycle": life})["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 120
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1801
    assert startup["periodSeconds"] * (startup["failureThreshold"] - 1) < 1801
    assert (c["readinessProbe"]["periodSeconds"], c["readinessProbe"]["failureThreshold"]) == (2, 3)
    assert c["readinessProbe"]["timeoutSeconds"] <= 2  # never longer than the period
    assert (c["livenessProbe"]["periodSeconds"], c["livenessProbe"]["failureThreshold"]) == (20, 4)


def test_a_failing_server_leaves_its_last_words_as_the_termination_message():
    """Issue 15, findings 4 and 7: the log's end becomes the message the status shows."""
    c = render_statefulset("ev", "ns", UID, {})["spec"]["template"]["spec"]["containers"][0]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_an_unpinned_image_is_the_operators_and_follows_it(monkeypatch):
    """Issue 15, finding 8: no image in the spec -> the operator's setting (set by the chart
    from its version), so upgrading the operator rolls the servers onto the new image."""
    monkeypatch.setenv("DS_OPERATOR_SERVER_IMAGE", "reg.example/ds/server:0.3.0")
    c = render_statefulset("ev", "ns", UID, {})["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "reg.example/ds/server:0.3.0"
    before = config_hash({})
    monkeypatch.setenv("DS_OPERATOR_SERVER_IMAGE", "reg.example/ds/server:0.4.0")
    assert config_hash({}) != before  # the pods roll
    pinned = {"image": "mine:1"}
    c = render_statefulset("ev", "ns", UID, pinned)["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "mine:1"
    assert config_hash(pinned) == config_hash(pinned)


def test_image_pull_secrets_from_the_spec_or_the_operator(monkeypatch):
    def secrets(spec):
        return render_statefulset("ev", "ns", UID, spec)["spec"]["template"]["spec"].get(
            "imagePullSecrets"
        )

    monkeypatch.delenv("DS_OPERATOR_SERVER_IMAGE_PULL_SECRETS", raising=False)
    assert secrets({}) is None
    monkeypatch.setenv("DS_OPERATOR_SERVER_IMAGE_PULL_SECRETS", "regcred, other")
    assert secrets({}) == [{"name": "regcred"}, {"name": "other"}]
    assert secrets({"imagePullSecrets": [{"name": "own"}]}) == [{"name": "own"}]


SUBSCRIPTIONS = {
    "webhookAllow": ["receiver.jobs.svc", "*.workers.svc", "10.244.0.0/16"],
    "publicURL": "http://events.default.svc:4437",
}
RETENTION = [
    {"prefix": "logs/", "maxBytes": "10Gi", "maxAge": "7d"},
    {"prefix": "metrics/", "maxAge": "12h"},
    {"prefix": "", "maxBytes": "512KiB"},
    {"prefix": "raw/", "maxBytes": "4096"},
]


def test_subscriptions_become_the_servers_webhook_settings():
    spec = {"server": {"subscriptions": SUBSCRIPTIONS}}
    env = render_configmap("events", "default", UID, spec)["data"]
    assert env["DS_WEBHOOK_ALLOW"] == "receiver.jobs.svc,*.workers.svc,10.244.0.0/16"
    assert env["DS_PUBLIC_URL"] == "http://events.default.svc:4437"
    assert "DS_RETENTION" not in env
    assert config_hash(spec) != config_hash({})  # the pods roll onto the new settings
    only_url = server_env({"server": {"subscriptions": {"publicURL": "https://s.example"}}})
    assert only_url["DS_PUBLIC_URL"] == "https://s.example" and "DS_WEBHOOK_ALLOW" not in only_url


def test_retention_becomes_the_servers_policies():
    """One ``PREFIX:RULES`` per entry, ``;`` between them; Kubernetes' Gi is the server's GiB."""
    spec = {"server": {"retention": RETENTION}}
    env = render_configmap("events", "default", UID, spec)["data"]
    assert env["DS_RETENTION"] == (
        "logs/:max-bytes=10GiB,max-age=7d;metrics/:max-age=12h;:max-bytes=512KiB;raw/:max-bytes=4096"
    )
    assert "DS_WEBHOOK_ALLOW" not in env and "DS_PUBLIC_URL" not in env
    assert config_hash(spec) != config_hash({})


def test_a_spec_without_them_renders_nothing_new():
    """Neither setting has a default: existing DurableStreams keep their env and their
    config hash, so upgrading the operator does not restart their servers."""
    env = server_env({})
    assert set(env) == {
        "DS_HOST",
        "DS_PORT",
        "DS_DATA_DIR",
        "DS_LONG_POLL_TIMEOUT",
        "DS_SSE_RECONNECT_INTERVAL",
        "DS_MAX_BODY_BYTES",
        "DS_DEFAULT_TTL",
        "DS_LOG_LEVEL",
        "DS_LOG_FORMAT",
        # One process without a CPU limit (test_workers_render.py): the server's default
        # today, in the ConfigMap only, which no pod reads before it restarts.
        "DS_WORKERS",
    }
    assert {"subscriptions", "retention"}.isdisjoint(with_defaults({}).raw["server"])
    empty = {"server": {"subscriptions": {"webhookAllow": []}, "retention": []}}
    assert server_env(empty) == env


def test_retention_the_crd_refuses_is_refused_by_the_operator_too():
    """The CRD's CEL rule (a rule per entry) and map keys (a prefix once), for clusters
    that did not run them: else the servers would crash-loop on DS_RETENTION."""
    no_rule = {"server": {"retention": [{"prefix": "logs/", "maxAge": "1d"}, {"prefix": "x/"}]}}
    assert "server.retention[1]" in refused_change(None, no_rule)  # on create too
    assert "neither maxBytes nor maxAge" in refused_change({}, no_rule)
    assert "neither" in refused_change({"replicas": 1}, no_rule)
    twice = {"server": {"retention": [{"prefix": "a/", "maxAge": "1d"}] * 2}}
    assert "more than once" in refused_change(None, twice)
    assert refused_change({"replicas": 1}, {"server": {"retention": RETENTION}}) is None


@pytest.mark.parametrize(
    ("spec", "pinned"),
    [
        ({"image": "ds:1"}, "2e9d69cfdc5a936d"),
        (
            {
                "image": "ds:1",
                "replicas": 3,
                "server": {
                    "tlsSecretName": "t",
                    "rateLimit": {"requestsPerSecond": 5},
                    "retention": [{"prefix": "logs/", "maxAge": "7d"}],
                },
            },
            # As a cluster stores it, with the CRD's rateLimit.burst 100, which the parse
            # now sets as well (the pin taken without it was a spec no cluster holds).
            "62fa25483b3edd7e",
        ),
        (
            {
                "image": "ds:1",
                "replicas": 5,
                "replication": {"minInSync": 2, "readStalenessSeconds": 9},
                # Whole: given resources replace the defaults (issue 42), so a spec that
                # gave only limits.cpu now hashes (and renders) differently: one roll.
                "resources": {
                    "requests": {"cpu": "250m", "memory": "256Mi"},
                    "limits": {"cpu": "2", "memory": "1Gi"},
                },
            },
            "8727eba4be8c44ad",
        ),
    ],
)
def test_the_config_hash_is_what_the_dict_spec_operator_computed(spec, pinned):
    """The hash is taken over the defaulted spec as the operator before the typed spec
    took it: an operator upgrade that changed it would restart every server once."""
    assert config_hash(spec) == pinned


def _pod_security_contexts(obj: Any) -> Iterator[dict[str, Any]]:
    """Every pod-level security context in ``obj`` (a pod spec's ``securityContext`` with
    ``fsGroup``, a Spark role's ``podSecurityContext``)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("securityContext", "podSecurityContext") and "fsGroup" in value:
                yield value
            else:
                yield from _pod_security_contexts(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _pod_security_contexts(item)


def test_a_pod_with_an_fs_group_is_not_chowned_through_at_each_start():
    """Issue 42: fsGroup alone (fsGroupChangePolicy Always) makes the kubelet chown every
    file of the volume at each pod start; with many streams, minutes of it."""
    spec = {**spark_manifests.EXAMPLE_SPEC, "replicas": 3}
    rendered: list[Any] = [
        desired_objects("ev", "ns", UID, spec),
        spark.render_scheduled_applications("ev", "ns", UID, spec),
        spark.render_pod_template("ev", 0, spec, "stats"),
    ]
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "manifests" / "spark").glob("*.yaml")):
        rendered.append(list(yaml.safe_load_all(path.read_text())))
    contexts = list(_pod_security_contexts(rendered))
    assert len(contexts) >= 8  # the servers', and the Spark drivers' and executors'
    for context in contexts:
        assert context["fsGroupChangePolicy"] == "OnRootMismatch", context


def _requests_within_limits(resources: dict[str, Any]) -> bool:
    """What the API server checks of a container: no request above its limit."""
    limits = resources.get("limits") or {}
    return all(
        quantity_bytes(str(value)) <= quantity_bytes(str(limits[res]))
        for res, value in (resources.get("requests") or {}).items()
        if res in limits and res != "cpu"
    )


@pytest.mark.parametrize(
    "given",
    [
        {"limits": {"memory": "128Mi"}},
        {"requests": {"cpu": "100m"}},
        {"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi", "cpu": "1"}},
        {},
    ],
)
def test_given_resources_replace_the_defaults_whole(given: dict[str, Any]):
    """Issue 42: merged over the defaults, ``limits.memory: 128Mi`` kept the default
    request of 256Mi, and the API server refused the pod (a request above its limit)."""
    container = render_statefulset("ev", "ns", UID, {"resources": given})["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert container["resources"] == given
    assert _requests_within_limits(container["resources"])
    default = render_statefulset("ev", "ns", UID, {})["spec"]["template"]["spec"]["containers"][0]
    assert default["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
