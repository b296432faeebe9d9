"""The CRDs' structural schema as kube-apiserver applies it (testkit.crd_schema), and
the defaults living there rather than in the operator.

kube-apiserver's documented behaviour, which each test cites
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/):

- #field-pruning: "the API server ... prunes (drops) fields not specified in the
  OpenAPI schema", and keeps them under ``x-kubernetes-preserve-unknown-fields: true``;
  an unknown field is dropped, the object is not refused;
- #defaulting: defaults are set where a field is missing and its parent exists
  ("defaulting happens on the object ... in the request to the API server ... when
  reading from etcd", not written back), so a CRD upgrade that adds a default makes
  every stored object come back with it;
- #defaulting-and-nullable: "null values for fields that either don't specify the
  nullable flag, or give it a false value, will be pruned before defaulting happens.
  If a default is present, it will be applied. When nullable is true, null values will
  be conserved and won't be defaulted";
- "Default values must be pruned (with the exception of defaults for metadata fields)
  and must validate against a provided schema": a CRD whose default breaks this is
  refused.

And the operator's side (issue 42): the CRD upgrade that adds a default must not roll
the servers. An object stored under the older CRD, read under the newer one, renders
the same StatefulSet template, config hash included.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from stream_operator.api import spec
from stream_operator.api.spec import with_defaults
from stream_operator.specs import render
from testkit import crd_schema
from testkit.cluster import Cluster, cluster
from testkit.kube import BACKUP_CRD_FILE, CRD_FILE, durable_stream

NS = "default"
CRD_NAME = "durablestreams.streams.pyds.dev"


def crd_doc() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


def schema_of(doc: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in doc["spec"]["versions"] if v.get("storage"))["schema"]["openAPIV3Schema"]


SCHEMA = schema_of(crd_doc())


def defaults_in(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every property with a ``default`` (under objects' properties)."""
    if "default" in schema:
        yield path
    for name, sub in (schema.get("properties") or {}).items():
        yield from defaults_in(sub, (*path, name))


def subschema(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for name in path:
        schema = schema["properties"][name]
    return schema


# A spec with every optional object that holds a defaulted field, with what it requires:
# every default of the schema applies to it.
EVERY_PARENT: dict[str, Any] = {
    "server": {"authTokensSecret": {"name": "tokens"}, "rateLimit": {"requestsPerSecond": 5}},
    "certificates": {"issuerRef": {"name": "ca"}},
    "metrics": {"podMonitor": {}},
    "analytics": {},
}


def operator_defaulted(given: dict[str, Any]) -> dict[str, Any]:
    """``with_defaults``'s spec, without what comes from the operator's own settings."""
    raw = copy.deepcopy(dict(with_defaults(given).raw))
    raw.pop("image")
    raw.pop("imagePullSecrets")
    return raw


def template_of(obj: dict[str, Any]) -> dict[str, Any]:
    sts = render.render_statefulset("x", NS, "uid-1", obj.get("spec"))
    return sts["spec"]["template"]


@pytest.fixture(scope="module")
def kube() -> Iterator[Cluster]:
    with cluster() as c:
        yield c


# -- pruning -------------------------------------------------------------------------------


def test_an_unknown_field_is_pruned_not_refused(kube: Cluster):
    """#field-pruning: unknown fields are dropped on create and on update, the write
    succeeds; under x-kubernetes-preserve-unknown-fields (resources, a container's
    resources passed through) they stay; the root's metadata is kept whole."""
    obj = durable_stream(
        "pruned",
        {
            "replicas": 1,
            "bogus": True,
            "server": {"logLevel": "debug", "bogus": 1},
            "resources": {"limits": {"memory": "1Gi"}, "claims": [{"name": "gpu"}]},
        },
    )
    obj["metadata"]["labels"] = {"team": "a"}
    assert kube.create(obj).status_code == 201
    stored = kube.get("DurableStream", NS, "pruned")
    assert stored is not None
    assert "bogus" not in stored["spec"] and "bogus" not in stored["spec"]["server"]
    assert stored["spec"]["server"]["logLevel"] == "debug"
    assert stored["spec"]["resources"]["claims"] == [{"name": "gpu"}]
    assert stored["metadata"]["labels"] == {"team": "a"}
    r = kube.patch("DurableStream", NS, "pruned", {"spec": {"storage": {"bogus": "x"}}})
    assert r.status_code == 200
    assert "bogus" not in r.json()["spec"]["storage"]


def test_pruning_keeps_preserved_subtrees_and_additional_properties():
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "map": {"type": "object", "additionalProperties": {"type": "string"}},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"a": {"type": "string"}}},
            },
        },
    }
    obj = {
        "apiVersion": "v1",
        "kind": "K",
        "metadata": {"name": "n", "annotations": {"a": "b"}},
        "free": {"any": {"thing": 1}},
        "map": {"k": "v"},
        "items": [{"a": "x", "b": "dropped"}],
        "gone": 1,
    }
    assert crd_schema.prune(copy.deepcopy(obj), schema, root=True) == {
        **{k: v for k, v in obj.items() if k != "gone"},
        "items": [{"a": "x"}],
    }


# -- defaulting ----------------------------------------------------------------------------


def test_a_created_object_comes_back_with_the_schemas_defaults(kube: Cluster):
    """#defaulting: a DurableStream created with an empty spec, or none, is stored and
    returned with every default of the schema, the same the operator would apply."""
    kube.create(durable_stream("defaulted", {})).raise_for_status()
    bare = durable_stream("nospec")
    bare.pop("spec")
    kube.create(bare).raise_for_status()
    for name in ("defaulted", "nospec"):
        stored = kube.get("DurableStream", NS, name)
        assert stored is not None
        assert stored["spec"] == operator_defaulted({})
    stored = kube.get("DurableStream", NS, "defaulted")
    assert stored is not None and stored["spec"]["storage"]["size"] == "10Gi"


def test_defaults_apply_only_where_the_parent_exists():
    """#defaulting: a default under an optional object is set only when the object is
    given (no ``certificates`` appears for ``issuerRef.kind``)."""
    plain = crd_schema.admit(SCHEMA, durable_stream("p", {}))
    assert "certificates" not in plain["spec"] and "rateLimit" not in plain["spec"]["server"]
    given = crd_schema.admit(SCHEMA, durable_stream("g", copy.deepcopy(EVERY_PARENT)))
    assert given["spec"]["server"]["rateLimit"] == {"requestsPerSecond": 5, "burst": 100}
    assert given["spec"]["certificates"]["issuerRef"] == {
        "name": "ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }


def test_nulls_are_dropped_or_defaulted_unless_nullable():
    """#defaulting-and-nullable."""
    schema = {
        "type": "object",
        "properties": {
            "withDefault": {"type": "integer", "default": 3},
            "without": {"type": "integer"},
            "nullable": {"type": "integer", "nullable": True, "default": 4},
        },
    }
    obj = {"withDefault": None, "without": None, "nullable": None}
    assert crd_schema.default(obj, schema) == {"withDefault": 3, "nullable": None}
    assert not crd_schema.validate(schema, obj)


@pytest.mark.parametrize("crd", [CRD_FILE, BACKUP_CRD_FILE], ids=lambda p: p.stem)
def test_every_default_is_pruned_and_valid(crd):
    """A default with a field its schema prunes, or one its schema refuses, would make
    kube-apiserver refuse the CRD ("Default values must be pruned ... and must validate
    against a provided schema")."""
    schema = schema_of(yaml.safe_load(crd.read_text()))
    paths = list(defaults_in(schema))
    for path in paths:
        sub = subschema(schema, path)
        value = sub["default"]
        assert crd_schema.prune(copy.deepcopy(value), sub) == value, path
        jsonschema.validate(value, crd_schema.openapi_as_jsonschema(sub))


def test_the_operators_defaults_are_the_schemas():
    """The defaults live in the schema; ``with_defaults`` (the operator's fallback for a
    spec no schema defaulted) fills in exactly the same, inside optional objects too."""
    for given in ({}, EVERY_PARENT):
        obj = crd_schema.admit(SCHEMA, durable_stream("d", copy.deepcopy(given)))
        assert obj["spec"] == operator_defaulted(given)


def test_defaults_apply_on_read_after_a_crd_upgrade(kube: Cluster):
    """#defaulting ("when reading from etcd using the storage version defaults"): an
    object stored before the CRD had a default is returned with it, at the same
    resourceVersion (nothing was written)."""
    kube.create(durable_stream("older", {})).raise_for_status()
    before = kube.get("DurableStream", NS, "older")
    assert before is not None
    upgrade(kube, with_new_default(crd_doc()))
    after = kube.get("DurableStream", NS, "older")
    assert after is not None
    assert after["spec"]["server"]["newKnobSeconds"] == 7
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    upgrade(kube, crd_doc())  # as it was, for the module's other tests


# -- a CRD upgrade rolls no pod (issue 42) ------------------------------------------------


def with_new_default(doc: dict[str, Any]) -> dict[str, Any]:
    """The CRD a later chart might ship: a new server setting with a default."""
    doc = copy.deepcopy(doc)
    server = schema_of(doc)["properties"]["spec"]["properties"]["server"]
    server["properties"]["newKnobSeconds"] = {"type": "integer", "default": 7, "minimum": 1}
    return doc


def without_default(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The CRD as it was before it had the default at ``path`` (under spec)."""
    doc = copy.deepcopy(doc)
    del subschema(schema_of(doc)["properties"]["spec"], path)["default"]
    return doc


def upgrade(kube: Cluster, doc: dict[str, Any]) -> None:
    """``helm upgrade`` of the CRD template: the CRD's spec replaced."""
    r = kube.patch("CustomResourceDefinition", None, CRD_NAME, {"spec": doc["spec"]})
    r.raise_for_status()


SPEC_DEFAULTS = list(defaults_in(SCHEMA["properties"]["spec"]))


@pytest.mark.parametrize("path", SPEC_DEFAULTS, ids=".".join)
def test_a_default_the_crd_gains_changes_no_pod_template(path: tuple[str, ...]):
    """For every default of the schema, as if the CRD had gained it in an upgrade: the
    object stored under the CRD without it, then read under the CRD with it, renders the
    same pod template (config hash included), so the upgrade rolls no pod."""
    older = schema_of(without_default(crd_doc(), path))
    # Pruned and defaulted as the older CRD stored it (its rules may not have read the
    # field yet: replicas, the lease timings).
    stored = durable_stream("x", copy.deepcopy(EVERY_PARENT))
    crd_schema.default(crd_schema.prune(stored, older, root=True), older)
    read = crd_schema.on_read(SCHEMA, stored)
    assert template_of(read) == template_of(stored)


def test_every_later_default_is_the_crds():
    """A default the CRD gained later is known to the operator with the CRD's value, or
    its hash would leave out a value the API server never fills in (and the other way
    round: a CRD default missing here, where it belongs, changes every hash at once;
    test_render.py's pinned hashes catch that)."""
    crd = {p: subschema(SCHEMA["properties"]["spec"], p)["default"] for p in SPEC_DEFAULTS}
    for path, value in spec.LATER_DEFAULTS.items():
        assert crd.get(path) == value, path
    for path in set(spec.LATER_DEFAULTS) & set(spec.NESTED_DEFAULTS):
        pytest.fail(f"{path} is both a nested default the hash covers and a later one")


def test_a_crd_upgrade_with_a_new_default_rolls_no_pod(
    kube: Cluster, monkeypatch: pytest.MonkeyPatch
):
    """Issue 42, through the emulated API server. An object stored under the CRD of
    today; the chart's next CRD adds a defaulted server setting and the next operator
    knows it (``spec.LATER_DEFAULTS``). The object read after the upgrade has the
    default, and the StatefulSet template the new operator renders from it is the one
    today's operator rendered: no roll. Had the new operator put the default in
    ``DEFAULTS`` (as before issue 42), the config hash would change."""
    kube.create(durable_stream("kept", copy.deepcopy(EVERY_PARENT))).raise_for_status()
    stored = kube.get("DurableStream", NS, "kept")
    assert stored is not None
    before, hash_before = template_of(stored), render.config_hash(stored["spec"])
    upgrade(kube, with_new_default(crd_doc()))
    try:
        read = kube.get("DurableStream", NS, "kept")
        assert read is not None and read["spec"]["server"]["newKnobSeconds"] == 7
        with monkeypatch.context() as m:
            m.setattr(spec, "LATER_DEFAULTS", {("server", "newKnobSeconds"): 7})
            assert template_of(read) == before
            assert render.config_hash(read["spec"]) == hash_before
            changed = copy.deepcopy(read["spec"])
            changed["server"]["newKnobSeconds"] = 8  # a value of its own still rolls
            assert render.config_hash(changed) != render.config_hash(read["spec"])
        with monkeypatch.context() as m:
            server = {**spec.DEFAULTS["server"], "newKnobSeconds": 7}
            m.setitem(spec.DEFAULTS, "server", server)
            assert render.config_hash(read["spec"]) != hash_before
    finally:
        upgrade(kube, crd_doc())


def test_a_nested_default_the_crd_had_rolls_no_pod(kube: Cluster):
    """The same for a default inside an optional object (``server.rateLimit.burst``):
    a spec stored without it (written before the default, or never defaulted) and one
    read with it hash alike, as the operator sets it where the object is given."""
    upgrade(kube, without_default(crd_doc(), ("server", "rateLimit", "burst")))
    try:
        spec_ = {"server": {"rateLimit": {"requestsPerSecond": 5}}}
        kube.create(durable_stream("burst", spec_)).raise_for_status()
        stored = kube.get("DurableStream", NS, "burst")
        assert stored is not None and "burst" not in stored["spec"]["server"]["rateLimit"]
        upgrade(kube, crd_doc())
        read = kube.get("DurableStream", NS, "burst")
        assert read is not None and read["spec"]["server"]["rateLimit"]["burst"] == 100
        assert template_of(read) == template_of(stored)
    finally:
        upgrade(kube, crd_doc())
