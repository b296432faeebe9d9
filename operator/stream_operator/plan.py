"""What a reconcile must change, decided from what was read: drift, growth, leftovers.

Pure functions over plain dicts (objects as the API returns them), so each
decision is unit-tested without a cluster; ``apply`` and ``handlers`` only
read, call these, and carry out the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def drifted_fields(desired: Any, live: Any, path: str = "") -> list[str]:
    """The paths where ``live`` no longer holds what ``desired`` renders.

    A field the API server (or another controller) added is not drift: only a
    rendered field that is missing or different is. Lists must match item by
    item, each item compared the same way (the server adds defaults inside
    container and port entries, never whole entries).
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "."]
        out: list[str] = []
        for key, value in desired.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in live:
                out.append(sub)
            else:
                out += drifted_fields(value, live[key], sub)
        return out
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path or "."]
        out = []
        for i, (want, have) in enumerate(zip(desired, live, strict=True)):
            out += drifted_fields(want, have, f"{path}[{i}]")
        return out
    return [] if desired == live else [path or "."]


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
