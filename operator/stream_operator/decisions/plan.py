"""What a reconcile must change, decided from what was read: drift, growth, leftovers.

Pure functions over plain dicts (objects as the API returns them), so each
decision is unit-tested without a cluster; ``apply`` and ``handlers`` only
read, call these, and carry out the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_operator.api import quantities

# The lists of named items, by the field that names an item (their patchMergeKey in the
# built-in types): the API server and admission webhooks add items to them (a sidecar,
# its volume, an injected variable), never rename ours, so ours are found by that key.
LIST_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "readinessGates": "conditionType",
}
# A container's ports are named by containerPort, a Service's by port.
PORT_KEYS = ("containerPort", "port")
# Maps of quantities (a container's requests and limits, a claim's storage request) and
# the one quantity field: the API server stores a quantity in its canonical form
# ("1024Mi" as "1Gi", cpu 2 as "2"), so they are compared by value.
QUANTITY_MAPS = frozenset({"requests", "limits", "capacity", "overhead"})


def _item_key(field: str, items: list[Any]) -> str | None:
    """The field that names each item of list ``field`` (None: compared item by item)."""
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    if field in LIST_KEYS:
        key: str | None = LIST_KEYS[field]
    elif field == "ports":
        key = next((k for k in PORT_KEYS if all(k in i for i in items)), None)
    else:
        return None
    return key if key is not None and all(key in i for i in items) else None


def _keyed_drift(desired: list[Any], live: list[Any], key: str, path: str) -> list[str]:
    """Each rendered item must be there (found by ``key``) and hold what we render, in our
    order; items someone else added are theirs."""
    out: list[str] = []

    def ident(item: dict[str, Any]) -> tuple[Any, Any]:
        # A port is its number and protocol (TCP when left out, the API server's default):
        # one rule may hold 53/UDP and 53/TCP.
        return item.get(key), item.get("protocol", "TCP") if key in PORT_KEYS else None

    found = {ident(i): n for n, i in enumerate(live) if isinstance(i, dict)}
    positions = []
    for want in desired:
        sub = f"{path}[{key}={want[key]}]"
        if ident(want) not in found:
            out.append(sub)
            continue
        positions.append(found[ident(want)])
        out += drifted_fields(want, live[found[ident(want)]], sub)
    if positions != sorted(positions):
        out.append(path)
    return out


def drifted_fields(desired: Any, live: Any, path: str = "") -> list[str]:
    """The paths where ``live`` no longer holds what ``desired`` renders.

    Compared the way the API server stores an object, so that what it (or an admission
    webhook, or another controller) did to it is not mistaken for drift, which would be
    corrected on every resync, forever, fighting them:

    - a field we do not render is not ours: defaults the server fills in, labels and
      annotations others add;
    - a field we render empty (None, ``{}``, ``[]``, ``""``) may be omitted by the server;
    - quantities are compared by value (``1024Mi`` is ``1Gi``);
    - lists of named items (containers, volumes, env, ports, volumeMounts ...) are
      matched by name: ours must be there as rendered, extra items are someone else's;
      other lists must match item by item.

    A rendered field that is missing or holds another value is drift.
    """
    field = path.rsplit(".", 1)[-1]
    if isinstance(desired, dict):
        return _dict_drift(desired, live, field in QUANTITY_MAPS, path)
    if isinstance(desired, list):
        if not isinstance(live, list):
            return [path or "."]
        key = _item_key(field, desired)
        if key is not None:
            return _keyed_drift(desired, live, key, path)
        if len(live) != len(desired):
            return [path or "."]
        out = []
        for i, (want, have) in enumerate(zip(desired, live, strict=True)):
            out += drifted_fields(want, have, f"{path}[{i}]")
        return out
    if desired is None:
        return []
    return [] if desired == live else [path or "."]


def _dict_drift(desired: dict[Any, Any], live: Any, by_value: bool, path: str) -> list[str]:
    if not isinstance(live, dict):
        return [path or "."]
    out: list[str] = []
    for key, value in desired.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in live:
            if value not in (None, {}, [], ""):
                out.append(sub)
        elif by_value or key == "sizeLimit":
            if value != live[key] and not quantities.equal(value, live[key]):
                out.append(sub)
        else:
            out += drifted_fields(value, live[key], sub)
    return out


def pvc_request(pvc: Mapping[str, Any]) -> str | None:
    return (((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")


def smaller_pvcs(
    pvcs: Iterable[dict[str, Any]], size: str, size_bytes: Callable[[str], int]
) -> list[dict[str, Any]]:
    """The claims that ask for less than ``size`` (the ones a growth must patch)."""
    want = size_bytes(size)
    return [p for p in pvcs if (cur := pvc_request(p)) is None or size_bytes(cur) < want]


def pvc_capacity(pvc: Mapping[str, Any]) -> str | None:
    """What the volume holds now (``status.capacity``), None while the claim is unbound."""
    return (((pvc.get("status") or {}).get("capacity")) or {}).get("storage")


def short_claims(
    pvcs: Iterable[dict[str, Any]], size: str, replicas: int, size_bytes: Callable[[str], int]
) -> dict[str, str]:
    """The claims of ordinals below ``replicas`` that do not hold ``size`` yet, with what they do.

    A claim holds what both its request and, once bound, its capacity say: a grown
    request is only a promise until the resizer (and the kubelet, for the file
    system) has made the volume that large. Claims left behind by a scale-down
    (``whenScaled: Retain``) are no pod's volume and do not count.
    """
    want = size_bytes(size)
    out = {}
    for pvc in pvcs:
        name = pvc["metadata"]["name"]
        ordinal = name.rsplit("-", 1)[-1]
        if not ordinal.isdigit() or int(ordinal) >= replicas:
            continue
        held = [q for q in (pvc_request(pvc), pvc_capacity(pvc)) if q is not None]
        smallest = min(held, key=size_bytes) if held else "nothing"
        if not held or size_bytes(smallest) < want:
            out[name] = smallest
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Expansion:
    """Which claims can grow now, and why each of the others cannot."""

    grow: list[str] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)

    def message(self, size: str) -> str:
        why = sorted(set(self.blocked.values()))
        names = ", ".join(sorted(self.blocked))
        return f"cannot grow {names} to {size}: {'; '.join(why)}"


def plan_expansion(
    smaller: Iterable[dict[str, Any]], classes: Mapping[str, dict[str, Any] | None]
) -> Expansion:
    """Promise growth only where the claim's StorageClass allows it.

    The API server refuses (403) to grow a claim without a class, or whose class
    does not set ``allowVolumeExpansion: true``; asking anyway only buys a retry
    loop and a status that claims the change went through. ``classes`` maps each
    class name the claims use to the StorageClass (None: it does not exist).
    """
    plan = Expansion()
    for pvc in smaller:
        name = pvc["metadata"]["name"]
        cls = (pvc.get("spec") or {}).get("storageClassName") or ""
        if not cls:
            plan.blocked[name] = "the claim has no StorageClass (statically provisioned)"
        elif (found := classes.get(cls)) is None:
            plan.blocked[name] = f"StorageClass {cls} does not exist"
        elif found.get("allowVolumeExpansion") is not True:
            plan.blocked[name] = f"StorageClass {cls} does not allow volume expansion"
        else:
            plan.grow.append(name)
    return plan


def stale_objects(
    live: Iterable[dict[str, Any]], rendered: Iterable[tuple[str, str]], owner_uid: str
) -> list[tuple[str, str]]:
    """(kind, name) of objects this DurableStream owns but no longer renders.

    Ownership is the controller owner reference with the DurableStream's uid, not
    the labels: labels can be copied by hand, and an object someone else made must
    never be deleted.
    """
    keep = set(rendered)
    out = []
    for obj in live:
        meta = obj.get("metadata") or {}
        key = (obj["kind"], meta["name"])
        owned = any(
            ref.get("uid") == owner_uid and ref.get("controller")
            for ref in meta.get("ownerReferences") or []
        )
        if owned and key not in keep and not meta.get("deletionTimestamp"):
            out.append(key)
    return sorted(out)
