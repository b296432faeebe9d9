"""What kube-apiserver does to a custom resource with its CRD's structural schema, in
its order (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/):

1. pruning (#field-pruning): fields the schema does not specify are dropped, not
   refused, except under ``x-kubernetes-preserve-unknown-fields: true``; the root's
   ``apiVersion``, ``kind`` and ``metadata`` are kept;
2. defaulting (#defaulting): a property's ``default`` is set where it is missing (or
   null and not ``nullable``) and its parent object exists, then defaulting goes on
   inside what was set, so ``spec: {default: {}}`` brings the defaults under it; a
   non-nullable null without a default is dropped ("null values for fields that either
   don't specify the nullable flag, or give it a false value, will be pruned before
   defaulting happens"). Defaults apply on read too ("when reading from etcd using
   the storage version defaults", never written back): ``on_read``;
3. OpenAPI validation, and the ``x-kubernetes-list-type`` keys;
4. the ``x-kubernetes-validations`` CEL rules (testkit.crd_cel) with ``self`` and, for
   a transition rule on an update, ``oldSelf``; a transition rule is skipped where
   there is no old value. CEL is not run when the object has a type error
   (kube-apiserver's "blocking" errors).

On an update, an error about a value the update left as it was is dropped (validation
ratcheting, on by default since Kubernetes 1.30: #validation-ratcheting), but for
transition rules. A refusal is ``Invalid`` (testkit.crd_errors): the field errors as
kube-apiserver writes them (``spec.x: Invalid value: ...: <message>``) and the 422
Status's message and causes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from testkit import crd_cel
from testkit.crd_errors import REASONS, FieldError, Invalid, field_path, openapi_error

ROOT_KEPT = ("apiVersion", "kind", "metadata")
# -- pruning and defaulting -------------------------------------------------------------


def prune(value: Any, schema: dict[str, Any], *, root: bool = False) -> Any:
    """``value`` without the fields ``schema`` does not specify (in place; returned)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
        for key in list(value):
            if root and key in ROOT_KEPT:
                continue
            if key in props:
                prune(value[key], props[key])
            elif isinstance(extra, dict):
                prune(value[key], extra)
            elif not keep:
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            prune(item, schema["items"])
    return value


def default(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` with the schema's defaults set (in place; returned): k8s.io/
    apiextensions-apiserver's PruneNonNullableNullsWithoutDefaults, then Default."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            missing = key not in value or (value[key] is None and not sub.get("nullable"))
            if missing and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            elif key in value and value[key] is None and not sub.get("nullable"):
                del value[key]
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                default(item, props[key])
            elif isinstance(extra, dict):
                default(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            default(item, schema["items"])
    return value


def on_read(schema: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """A stored object as a read returns it under ``schema`` (a CRD upgraded since it
    was written): pruned and defaulted, a copy (nothing is written back)."""
    read = copy.deepcopy(obj)
    default(prune(read, schema, root=True), schema)
    return read


# -- validation ---------------------------------------------------------------------------


def openapi_as_jsonschema(schema: Any) -> Any:
    """An OpenAPI v3 schema as plain JSON Schema (drop the x-kubernetes-* extensions)."""
    if isinstance(schema, dict):
        out = {
            k: openapi_as_jsonschema(v)
            for k, v in schema.items()
            if not k.startswith("x-kubernetes-")
        }
        if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
            "x-kubernetes-int-or-string"
        ):
            out.pop("type", None)
        if schema.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [openapi_as_jsonschema(v) for v in schema]
    return schema


def _list_keys(value: Any, schema: dict[str, Any], path: list[Any]) -> Iterator[FieldError]:
    """``x-kubernetes-list-type`` map and set: each key (each item) at most once."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, item in value.items():
            sub = props.get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                yield from _list_keys(item, sub, [*path, key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        kind, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys")
        seen: list[Any] = []
        for i, item in enumerate(value):
            key = {k: item.get(k) for k in keys} if kind == "map" and keys else item
            if kind in ("map", "set") and key in seen:
                yield FieldError(field_path([*path, i]), "Duplicate value", key, "")
            seen.append(key)
            yield from _list_keys(item, schema["items"], [*path, i])


def _at(obj: Any, path: list[Any]) -> tuple[bool, Any]:
    for part in path:
        try:
            obj = obj[part]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, obj


def _unchanged(old: Any, new: Any, path: list[Any]) -> bool:
    """Whether an update left the value at ``path`` as it was (validation ratcheting)."""
    if old is None:
        return False
    found_old, before = _at(old, path)
    found_new, after = _at(new, path)
    return found_old and found_new and before == after


# The JSON Schema validator of each schema in use, by identity (the schema kept with it,
# so that its id is not reused): converting the chart's schema on every write was slow.
_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}


def _validator(schema: dict[str, Any]) -> Any:
    kept = _VALIDATORS.get(id(schema))
    if kept is None or kept[0] is not schema:
        kept = (schema, jsonschema.Draft4Validator(openapi_as_jsonschema(schema)))
        _VALIDATORS[id(schema)] = kept
    return kept[1]


def validate(
    schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None
) -> list[FieldError]:
    """Every field error of ``obj`` (OpenAPI, list keys, then the CEL rules)."""
    errors: list[FieldError] = []
    blocking = False
    validator = _validator(schema)
    for exc in validator.iter_errors(obj):
        blocking = blocking or exc.validator == "type"
        if not _unchanged(old, obj, list(exc.absolute_path)):
            errors.append(openapi_error(exc))
    errors += [
        e
        for e in _list_keys(obj, schema, [])
        if old is None or e not in _list_keys(old, schema, [])
    ]
    if blocking:
        return errors  # kube-apiserver does not run CEL over values of the wrong type
    meta = obj.get("metadata") or {}
    root = {**obj, "metadata": {k: meta[k] for k in ("name", "generateName") if k in meta}}
    old_root = None if old is None else {**old, "metadata": root["metadata"]}
    return errors + list(_rules(root, old_root, old is not None, schema, []))


def _rules(
    value: Any, old: Any, has_old: bool, schema: dict[str, Any], path: list[Any]
) -> Iterator[FieldError]:
    """The ``x-kubernetes-validations`` of ``schema`` and below, on ``value``."""
    kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else None
    for rule in schema.get("x-kubernetes-validations") or ():
        transition = crd_cel.uses_old_self(rule)
        if transition and not has_old:
            continue
        if not transition and has_old and old == value:
            continue  # ratcheting: an unchanged value is not checked again
        outcome = crd_cel.evaluate(rule, value, old)
        if outcome.passed:
            continue
        where = field_path(path) + (str(rule.get("fieldPath") or "") if not outcome.error else "")
        error_type = (
            "Invalid value" if outcome.error else REASONS[rule.get("reason") or "FieldValueInvalid"]
        )
        shown = kind or schema.get("type") or type(value).__name__
        yield FieldError(where, error_type, shown, outcome.message)
    for key, item, old_item, here, sub in _children(value, old, has_old, schema):
        yield from _rules(item, old_item, here, sub, [*path, key])


def _children(
    value: Any, old: Any, has_old: bool, schema: dict[str, Any]
) -> Iterator[tuple[Any, Any, Any, bool, dict[str, Any]]]:
    """(key, value, old value, whether there is one, schema) of each child: an object's
    by name, a list-type map's items by their keys (others have no old value, as
    kube-apiserver correlates no other list's items)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, item in value.items():
            sub = props.get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                here = has_old and isinstance(old, dict) and key in old
                yield key, item, old[key] if here else None, here, sub
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        olds = {}
        if has_old and keys and isinstance(old, list):
            olds = {json.dumps([o.get(k) for k in keys]): o for o in old if isinstance(o, dict)}
        for i, item in enumerate(value):
            ident = json.dumps([item.get(k) for k in keys]) if isinstance(item, dict) else ""
            yield i, item, olds.get(ident), ident in olds, schema["items"]


def admit(
    schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A create (``old`` None) or update of ``obj`` as kube-apiserver admits it: the
    object pruned and defaulted (in place, and returned), or ``Invalid``."""
    prune(obj, schema, root=True)
    default(obj, schema)
    errors = validate(schema, obj, old)
    if errors:
        raise Invalid(errors)
    return obj


def without_rules(crd: dict[str, Any]) -> dict[str, Any]:
    """``crd`` without its CEL rules, as a cluster has it that never ran them (the CRD
    of an older chart, or a Kubernetes before 1.25): for a test of what the operator
    refuses itself, which the rules would have refused first."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "x-kubernetes-validations"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(copy.deepcopy(crd))  # type: ignore[no-any-return]
