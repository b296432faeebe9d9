"""Kubernetes' protobuf encoding of Secrets and ConfigMaps, read into their JSON form.

Why: Helm (client-go's typed clients) writes its release records, Secrets by
default and ConfigMaps with ``HELM_DRIVER=configmap``, as
``application/vnd.kubernetes.protobuf``, which kube-apiserver accepts for every
built-in kind. kmock only reads JSON bodies, so without this the emulated API
server cannot run ``helm install``/``upgrade``. Answers stay JSON: client-go
accepts both.

Only the two kinds Helm's storage writes (and the DeleteOptions of its deletes) are read, and of ObjectMeta only the
fields a client sets (name, generateName, namespace, uid, resourceVersion,
labels, annotations, finalizers); anything else is a 415, as an API server
answers a body it cannot decode. The field numbers are those of
k8s.io/api/core/v1/generated.proto and k8s.io/apimachinery's runtime.Unknown and
ObjectMeta.
"""

from __future__ import annotations

import base64
from typing import Any

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"  # every protobuf body starts with it, then a runtime.Unknown


class Undecodable(ValueError):
    """A body that is not a protobuf Secret or ConfigMap this module reads."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise Undecodable("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one message: ints for varints, bytes otherwise."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _varint(buf, pos)
            out.append((number, buf[pos : pos + size]))
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((number, buf[pos : pos + width]))
            pos += width
        else:
            raise Undecodable(f"wire type {wire}")
    return out


def _entry(buf: bytes) -> tuple[str, bytes]:
    """One map entry (key = 1, value = 2)."""
    parts = dict(_fields(buf))
    key, value = parts.get(1, b""), parts.get(2, b"")
    assert isinstance(key, bytes) and isinstance(value, bytes)
    return key.decode(), value


def _metadata(buf: bytes) -> dict[str, Any]:
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    maps = {11: "labels", 12: "annotations"}
    meta: dict[str, Any] = {}
    for number, value in _fields(buf):
        if number in strings and isinstance(value, bytes):
            meta[strings[number]] = value.decode()
        elif number in maps and isinstance(value, bytes):
            key, text = _entry(value)
            meta.setdefault(maps[number], {})[key] = text.decode()
        elif number == 14 and isinstance(value, bytes):
            meta.setdefault("finalizers", []).append(value.decode())
    return meta


def _secret(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret"}
    for number, value in _fields(buf):
        if not isinstance(value, bytes):
            if number == 5:
                obj["immutable"] = bool(value)
            continue
        if number == 1:
            obj["metadata"] = _metadata(value)
        elif number == 2:
            key, raw = _entry(value)
            obj.setdefault("data", {})[key] = base64.b64encode(raw).decode()
        elif number == 3:
            obj["type"] = value.decode()
    return obj


def _config_map(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap"}
    for number, value in _fields(buf):
        if not isinstance(value, bytes):
            if number == 4:
                obj["immutable"] = bool(value)
            continue
        if number == 1:
            obj["metadata"] = _metadata(value)
        elif number == 2:
            key, raw = _entry(value)
            obj.setdefault("data", {})[key] = raw.decode()
        elif number == 3:
            key, raw = _entry(value)
            obj.setdefault("binaryData", {})[key] = base64.b64encode(raw).decode()
    return obj


def _delete_options(buf: bytes) -> dict[str, Any]:
    """The body of a DELETE (``helm uninstall`` purging its release Secrets)."""
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    for number, value in _fields(buf):
        if number == 1 and isinstance(value, int):
            obj["gracePeriodSeconds"] = value
        elif number == 4 and isinstance(value, bytes):
            obj["propagationPolicy"] = value.decode()
    return obj


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded Secret or ConfigMap request body."""
    if not body.startswith(MAGIC):
        raise Undecodable("no k8s protobuf magic")
    unknown = dict(_fields(body[len(MAGIC) :]))
    type_meta, raw = unknown.get(1, b""), unknown.get(2, b"")
    assert isinstance(type_meta, bytes) and isinstance(raw, bytes)
    names = {n: v.decode() for n, v in _fields(type_meta) if isinstance(v, bytes)}
    kind = (names.get(1, ""), names.get(2, ""))
    if kind == ("v1", "Secret"):
        return _secret(raw)
    if kind == ("v1", "ConfigMap"):
        return _config_map(raw)
    if kind == ("v1", "DeleteOptions"):
        return _delete_options(raw)
    raise Undecodable(f"{kind[0]} {kind[1]} is not read from protobuf here")
