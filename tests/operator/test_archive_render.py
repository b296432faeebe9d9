"""spec.backup, spec.bootstrap.recovery and spec.replica: parsed, refused, rendered (pure)."""

from __future__ import annotations

import datetime
from typing import Any

import jsonschema
import pytest
import yaml

from stream_operator.api import cron
from stream_operator.api.spec import refused_change, with_defaults
from stream_operator.controllers.archive_pods import choose_backup_pod
from stream_operator.decisions.replica_roles import LeaseView
from stream_operator.specs.render import config_hash, desired_objects
from testkit.kube import CRD_FILE, openapi_as_jsonschema

STORE = {
    "destinationPath": "s3://bucket/events",
    "endpointURL": "https://s3.example:8333",
    "s3Credentials": {
        "accessKeyId": {"name": "s3", "key": "id"},
        "secretAccessKey": {"name": "s3", "key": "secret"},
        "region": {"name": "s3", "key": "region"},
    },
    "endpointCA": {"name": "s3-ca", "key": "ca.pem"},
}
SOURCE = {"destinationPath": "s3://old/events", "s3Credentials": STORE["s3Credentials"]}


def objects(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in desired_objects("events", "ns", "uid", spec)}


def pod(spec: dict[str, Any]) -> dict[str, Any]:
    return objects(spec)["StatefulSet"]["spec"]["template"]["spec"]


def test_backup_renders_settings_in_the_configmap_and_credentials_from_the_secret():
    spec = {
        "backup": {
            "objectStore": STORE,
            "archiveTimeout": 5,
            "archiveMode": "required",
            "retentionPolicy": "last=7",
        }
    }
    data = objects(spec)["ConfigMap"]["data"]
    assert {k: v for k, v in data.items() if "ARCHIVE" in k or "BACKUP" in k} == {
        "DS_ARCHIVE_URL": "s3://bucket/events",
        "DS_ARCHIVE_ENDPOINT": "https://s3.example:8333",
        "DS_ARCHIVE_CA_BUNDLE": "/etc/durable-streams/archive-ca/ca.crt",
        "DS_ARCHIVE_TIMEOUT": "5",
        "DS_ARCHIVE_MODE": "required",
        "DS_BACKUP_RETENTION": "last=7",
    }
    assert not any(k.startswith("AWS_") for k in data)  # never in the ConfigMap
    env = {e["name"]: e for e in pod(spec)["containers"][0]["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {"secretKeyRef": {"name": "s3", "key": "id"}}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "secret"
    assert env["AWS_REGION"]["valueFrom"]["secretKeyRef"]["key"] == "region"
    volume = next(v for v in pod(spec)["volumes"] if v["name"] == "archive-ca")
    assert volume["secret"] == {
        "secretName": "s3-ca",
        "items": [{"key": "ca.pem", "path": "ca.crt"}],
    }
    mounts = {m["name"]: m["mountPath"] for m in pod(spec)["containers"][0]["volumeMounts"]}
    assert mounts["archive-ca"] == "/etc/durable-streams/archive-ca"


def test_no_archive_renders_nothing_new_and_keeps_the_config_hash():
    plain = objects({})
    assert not any("ARCHIVE" in k for k in plain["ConfigMap"]["data"])
    assert "initContainers" not in pod({})
    # The hash of a spec without an archive is what it was before archives existed.
    assert config_hash({}) == config_hash({"replica": {"enabled": False}})
    assert config_hash({}) != config_hash({"backup": {"objectStore": STORE}})
    # A schedule is the operator's alone: no pod restarts for it.
    with_store = {"backup": {"objectStore": STORE}}
    scheduled = {"backup": {"objectStore": STORE, "schedule": "0 3 * * *"}}
    assert config_hash(with_store) == config_hash(scheduled)


def test_a_replica_cluster_follows_its_source_and_promotion_renders_its_own_archive():
    spec = {
        "backup": {"objectStore": STORE, "archiveMode": "required"},
        "replica": {"enabled": True, "source": SOURCE},
    }
    data = objects(spec)["ConfigMap"]["data"]
    assert data["DS_ARCHIVE_FOLLOW"] == "true"
    assert data["DS_ARCHIVE_URL"] == "s3://old/events"
    assert "DS_ARCHIVE_MODE" not in data and "DS_ARCHIVE_ENDPOINT" not in data
    promoted = objects({**spec, "replica": {"enabled": False, "source": SOURCE}})
    data = promoted["ConfigMap"]["data"]
    assert "DS_ARCHIVE_FOLLOW" not in data
    assert (data["DS_ARCHIVE_URL"], data["DS_ARCHIVE_MODE"]) == ("s3://bucket/events", "required")
    assert config_hash(spec) != config_hash(
        {**spec, "replica": {"enabled": False, "source": SOURCE}}
    )


def test_recovery_is_an_init_container_on_the_first_pod_of_an_empty_volume():
    spec = {
        "replicas": 3,
        "bootstrap": {
            "recovery": {
                "source": {
                    **SOURCE,
                    "endpointURL": "http://s3:8333",
                    "endpointCA": {"name": "ca", "key": "k"},
                },
                "backupID": "20261126T040001Z-000000000000000a",
                "recoveryTarget": {"targetTime": "2026-11-26T04:30:00Z"},
            }
        },
    }
    (init,) = pod(spec)["initContainers"]
    script = init["command"][2]
    assert init["command"][:2] == ["/bin/sh", "-c"]
    assert 'if [ "$POD_NAME" != events-0 ]' in script
    assert "lost+found" in script
    assert script.splitlines()[-1] == (
        "exec durable-streams-server restore --archive-url s3://old/events --archive-endpoint "
        "http://s3:8333 --data-dir /data --backup 20261126T040001Z-000000000000000a "
        "--target-time 2026-11-26T04:30:00Z"
    )
    env = {e["name"]: e for e in init["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3"
    assert env["DS_ARCHIVE_CA_BUNDLE"]["value"] == "/etc/durable-streams/recovery-ca/ca.crt"
    assert {m["name"] for m in init["volumeMounts"]} == {"data", "tmp", "recovery-ca"}
    assert any(v["name"] == "recovery-ca" for v in pod(spec)["volumes"])
    # The server itself gets no archive from the recovery source.
    assert "DS_ARCHIVE_URL" not in objects(spec)["ConfigMap"]["data"]


RECOVERY = {"source": SOURCE}


@pytest.mark.parametrize(
    ("spec", "why", "crd"),
    [
        (
            {"backup": {"objectStore": {"destinationPath": "http://x/y"}}},
            "destinationPath",
            "schema",
        ),
        (
            {"backup": {"objectStore": STORE, "retentionPolicy": "forever"}},
            "retentionPolicy",
            "schema",
        ),
        ({"backup": {"objectStore": STORE, "schedule": "@daily"}}, "5 fields", "schema"),
        ({"backup": {"objectStore": STORE, "archiveMode": "sometimes"}}, "archiveMode", "schema"),
        (
            {
                "bootstrap": {
                    "recovery": {
                        **RECOVERY,
                        "recoveryTarget": {"targetTime": "2026-11-26T04:30:00Z", "targetLSN": 3},
                    }
                }
            },
            "not both",
            "give targetTime or targetLSN, not both",
        ),
        ({"replica": {"enabled": True}}, "replica.source", "replica.enabled needs replica.source"),
        # What only the operator checks: a field's range in a schedule, a time's zone.
        ({"backup": {"objectStore": STORE, "schedule": "0 25 * * *"}}, "hour", None),
        (
            {
                "bootstrap": {
                    "recovery": {
                        **RECOVERY,
                        "recoveryTarget": {"targetTime": "2026-11-26T04:30:00"},
                    }
                }
            },
            "RFC 3339",
            None,
        ),
    ],
)
def test_the_operator_refuses_what_the_crd_refuses(spec, why, crd):
    """``crd``: "schema" (the OpenAPI schema refuses it), a CEL rule's message, or None."""
    refusal = refused_change(None, spec)
    assert refusal is not None and why in refusal
    text = CRD_FILE.read_text()
    schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {
        "apiVersion": "streams.pyds.dev/v1alpha1",
        "kind": "DurableStream",
        "metadata": {"name": "x"},
        "spec": spec,
    }
    if crd == "schema":
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(obj, openapi_as_jsonschema(schema))
    else:
        jsonschema.validate(obj, openapi_as_jsonschema(schema))
        assert crd is None or f"message: {crd}" in text


def test_bootstrap_cannot_change_once_applied():
    rec = {"recovery": {"source": SOURCE}}
    assert refused_change({"storage": {"size": "10Gi"}}, {"bootstrap": rec}) is not None
    applied = {"storage": {"size": "10Gi"}, "bootstrap": rec}
    assert refused_change(applied, {"bootstrap": rec}) is None
    other = {"recovery": {"source": SOURCE, "backupID": "x"}}
    assert "bootstrap" in (refused_change(applied, {"bootstrap": other}) or "")
    assert refused_change({"storage": {"size": "10Gi"}}, {}) is None


def test_the_typed_spec():
    s = with_defaults({"backup": {"objectStore": STORE, "schedule": "0 3 * * *"}})
    assert s.backup is not None and s.backup.target == "prefer-standby"
    assert s.backup.object_store.credentials is not None
    assert s.recovery is None and not s.replica.enabled
    assert with_defaults({}).backup is None


UTC = datetime.UTC


@pytest.mark.parametrize(
    ("expr", "after", "due"),
    [
        (
            "0 3 * * *",
            datetime.datetime(2026, 11, 26, 4, 0, tzinfo=UTC),
            datetime.datetime(2026, 11, 27, 3, 0, tzinfo=UTC),
        ),
        (
            "*/15 * * * *",
            datetime.datetime(2026, 11, 26, 4, 7, 30, tzinfo=UTC),
            datetime.datetime(2026, 11, 26, 4, 15, tzinfo=UTC),
        ),
        (
            "30 0 0 * * *",
            datetime.datetime(2026, 11, 26, 0, 0, 30, tzinfo=UTC),
            datetime.datetime(2026, 11, 27, 0, 0, 30, tzinfo=UTC),
        ),
        (
            "* * * * * *",
            datetime.datetime(2026, 11, 26, 4, 0, 0, 500, tzinfo=UTC),
            datetime.datetime(2026, 11, 26, 4, 0, 1, tzinfo=UTC),
        ),
        # Sunday as 0 and as 7; 2026-11-29 is a Sunday.
        (
            "0 12 * * 0",
            datetime.datetime(2026, 11, 26, tzinfo=UTC),
            datetime.datetime(2026, 11, 29, 12, tzinfo=UTC),
        ),
        (
            "0 12 * * 7",
            datetime.datetime(2026, 11, 26, tzinfo=UTC),
            datetime.datetime(2026, 11, 29, 12, tzinfo=UTC),
        ),
        # Both day fields restricted: either matches (the 1st, or a Friday: 2026-11-27).
        (
            "0 0 1 * 5",
            datetime.datetime(2026, 11, 26, tzinfo=UTC),
            datetime.datetime(2026, 11, 27, tzinfo=UTC),
        ),
        (
            "0 0 29 2 *",
            datetime.datetime(2026, 3, 1, tzinfo=UTC),
            datetime.datetime(2028, 2, 29, tzinfo=UTC),
        ),
        (
            "0 9-17/4 * * 1-5",
            datetime.datetime(2026, 11, 28, tzinfo=UTC),
            datetime.datetime(2026, 11, 30, 9, tzinfo=UTC),
        ),
        (
            "5,10 1 * * *",
            datetime.datetime(2026, 11, 26, 1, 5, tzinfo=UTC),
            datetime.datetime(2026, 11, 26, 1, 10, tzinfo=UTC),
        ),
    ],
)
def test_cron_next_after(expr, after, due):
    assert cron.parse(expr).next_after(after) == due


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "60 * * * *",
        "* * 0 * *",
        "* * * 13 *",
        "*/0 * * * *",
        "5-1 * * * *",
        "0 0 * * MON",
        "0 0 31 2 *",
    ],
)
def test_cron_refuses(expr):
    assert cron.refused(expr)


def pods(*names: str, ready: bool = True) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {"name": n},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
        }
        for n in names
    ]


def test_the_backup_pod_is_an_in_sync_ready_standby_else_the_primary():
    view = LeaseView(holder="ds-0", in_sync=("ds-1", "ds-2"))
    every = pods("ds-0", "ds-1", "ds-2")
    assert choose_backup_pod("ds", True, view, every, "prefer-standby").pod == "ds-1"
    assert choose_backup_pod("ds", True, view, every, "primary").pod == "ds-0"
    not_ready = pods("ds-0") + pods("ds-1", ready=False) + pods("ds-2")
    assert choose_backup_pod("ds", True, view, not_ready, "prefer-standby").pod == "ds-2"
    alone = LeaseView(holder="ds-0")
    assert choose_backup_pod("ds", True, alone, every, "prefer-standby").pod == "ds-0"
    assert "no primary" in choose_backup_pod("ds", True, LeaseView(), every, "primary").why
    assert choose_backup_pod("ds", False, LeaseView(), pods("ds-0"), "prefer-standby").pod == "ds-0"
    assert choose_backup_pod("ds", False, LeaseView(), [], "prefer-standby").why
