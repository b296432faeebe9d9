"""Server-side apply's field ownership (``metadata.managedFields``), simplified.

kube-apiserver records, for every field manager, which fields it set (one entry per
manager and operation: ``Apply`` for server-side apply, ``Update`` for a create, a
patch or a put), and uses it two ways (k8s.io/apimachinery/pkg/util/managedfields and
sigs.k8s.io/structured-merge-diff):

- an apply that is not forced and would change a field another manager owns is
  refused, 409 Conflict, naming each field and its owner; a forced one takes them over;
- a field the applier owned and no longer sends is removed, unless another manager
  owns it too.

The simplification: maps are followed key by key, every list is one field (atomic),
where the real server follows the associative lists of the built-in types (containers
by name...) item by item. ``fieldsV1`` has the real shape (``{"f:spec": {"f:replicas":
{}}}``) at that granularity. Mutations by defaulting and admission go to the writer's
manager for an update, and to nobody for an apply.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

Path = tuple[str, ...]
APPLY, UPDATE = "Apply", "Update"
# Metadata the server owns: never a manager's field.
_SYSTEM_META = frozenset(
    {
        "name",
        "namespace",
        "generateName",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
_MISSING = object()


class Conflicts(Exception):
    """An apply that would change fields other managers own: (manager, path) each."""

    def __init__(self, conflicts: list[tuple[str, Path]], api_version: str) -> None:
        self.conflicts = conflicts
        self.api_version = api_version
        owners = sorted({m for m, _ in conflicts})
        lines = "".join(f"\n- {dotted(p)}" for _, p in conflicts)
        many = "conflicts" if len(conflicts) > 1 else "conflict"
        who = ", ".join(f'"{m}"' for m in owners)
        super().__init__(
            f"Apply failed with {len(conflicts)} {many}: {many} with {who} using "
            f"{api_version}:{lines}"
        )

    def causes(self) -> list[dict[str, str]]:
        """The Status details' causes, as kube-apiserver lists them."""
        return [
            {
                "type": "FieldManagerConflict",
                "message": f'conflict with "{m}" using {self.api_version}',
                "field": dotted(p),
            }
            for m, p in self.conflicts
        ]


def dotted(path: Path) -> str:
    return "".join(f".{p}" for p in path)


def manager_of(params: Any, user_agent: str) -> str:
    """``?fieldManager=``, else the User-Agent up to its first ``/`` (kube-apiserver's
    default for a write that names no manager)."""
    named = params.get("fieldManager")
    return str(named) if named else user_agent.split("/", 1)[0]


def leaves(obj: Any, status: bool = False) -> dict[Path, Any]:
    """Every field a manager can own, with its value: map keys followed, lists whole;
    the status only when ``status`` (the status subresource), never the system metadata."""
    out: dict[Path, Any] = {}

    def walk(value: Any, path: Path) -> None:
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                walk(sub, (*path, str(key)))
        else:
            out[path] = value

    for key, value in (obj or {}).items():
        if key in ("apiVersion", "kind") or (key == "status") != status:
            continue
        if key == "metadata" and isinstance(value, dict):
            walk({k: v for k, v in value.items() if k not in _SYSTEM_META}, ("metadata",))
        else:
            walk(value, (key,))
    out.pop(("metadata",), None)
    return out


def value_at(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def paths_of(fields: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in (fields or {}).items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        out |= paths_of(sub, path) if sub else {path}
    return out


def _owned(entries: list[dict[str, Any]]) -> list[tuple[dict[str, Any], set[Path]]]:
    return [(e, paths_of(e.get("fieldsV1"))) for e in entries]


def _entries(
    owned: list[tuple[dict[str, Any], set[Path]]],
    mine: tuple[str, str, str | None],
    paths: set[Path],
    template: dict[str, Any],
    now: str,
) -> list[dict[str, Any]]:
    """The entries after a write: each with its paths; the writer's (``mine``: manager,
    operation, subresource) set to ``paths``; a changed entry's time is now, an empty
    entry goes."""
    out = []
    found = False
    for entry, have in owned:
        if _key(entry) == mine:
            found, have = True, paths
        if not have:
            continue
        fields = fields_v1(have)
        if fields != entry.get("fieldsV1"):
            entry = {**entry, "fieldsV1": fields, "time": now}
        out.append(entry)
    if not found and paths:
        out.append(
            {**template, "time": now, "fieldsType": "FieldsV1", "fieldsV1": fields_v1(paths)}
        )
    return out


def _template(manager: str, operation: str, api_version: str, sub: str | None) -> dict[str, Any]:
    entry = {"manager": manager, "operation": operation, "apiVersion": api_version}
    return {**entry, "subresource": sub} if sub else entry


def updated(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    manager: str,
    now: str,
    subresource: str | None = None,
) -> list[dict[str, Any]]:
    """The entries after a create or update by ``manager``: it owns what it changed
    (defaults and admission's changes included), which no other manager owns any more."""
    status = subresource == "status"
    before = leaves(old, status) if old is not None else {}
    changed = {p for p, v in leaves(new, status).items() if before.get(p, _MISSING) != v}
    entries = ((old or {}).get("metadata") or {}).get("managedFields") or []
    owned = [
        (e, {p for p in have if not any(_overlaps(p, c) for c in changed)})
        for e, have in _owned(entries)
    ]
    mine = (manager, UPDATE, subresource)
    current = next((h for e, h in _present(owned, new) if _key(e) == mine), set())
    template = _template(manager, UPDATE, str(new.get("apiVersion", "")), subresource)
    return _entries(_present(owned, new), mine, current | changed, template, now)


def _merge(live: Any, applied: Any) -> Any:
    if not isinstance(live, dict) or not isinstance(applied, dict):
        return copy.deepcopy(applied)
    out = dict(live)
    for key, value in applied.items():
        out[key] = _merge(live.get(key), value)
    return out


def _remove(obj: dict[str, Any], path: Path) -> None:
    node: Any = obj
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def applied(
    live: dict[str, Any],
    config: dict[str, Any],
    manager: str,
    *,
    force: bool,
    now: str,
    settle: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """``live`` after ``manager`` applied ``config``, its managedFields set; raises
    ``Conflicts`` for a field another manager owns that the apply would change.

    ``settle`` is what the server does to any object it stores (defaults, canonical
    quantities, admission): a field counts as changed only if it differs once settled,
    as the real server compares typed, defaulted objects."""
    config = {**config, "metadata": {**(config.get("metadata") or {})}}
    config["metadata"].pop("managedFields", None)
    sent = set(leaves(config))
    owned = _owned((live.get("metadata") or {}).get("managedFields") or [])
    mine = (manager, APPLY, None)
    before = next((h for e, h in owned if _key(e) == mine), set())
    others = [(e, h) for e, h in owned if _key(e) != mine]
    new = _merge(live, config)
    new["metadata"] = _merge(live.get("metadata") or {}, config["metadata"])
    # A field it applied before and sends no more goes, unless someone else owns it
    # (or it is now part of, or holds, a field it sends).
    kept = {q for _, h in others for q in h} | sent
    for path in before - sent:
        if not any(_overlaps(path, q) for q in kept):
            _remove(new, path)
    settle(new)
    changing = {p for p in sent if value_at(live, p) != value_at(new, p)}
    conflicts = sorted(
        {
            (e["manager"], p)
            for p in changing
            for e, have in others
            if e["manager"] != manager
            and e.get("subresource") is None
            and any(_overlaps(p, q) for q in have)
        }
    )
    api_version = str(config.get("apiVersion") or live.get("apiVersion") or "")
    if conflicts and not force:
        raise Conflicts(conflicts, api_version)
    owned = [
        (e, h if _key(e) == mine else {q for q in h if not any(_overlaps(p, q) for p in changing)})
        for e, h in owned
    ]
    template = _template(manager, APPLY, api_version, None)
    new["metadata"]["managedFields"] = _entries(_present(owned, new), mine, sent, template, now)
    return new


def _present(
    owned: list[tuple[dict[str, Any], set[Path]]], obj: dict[str, Any]
) -> list[tuple[dict[str, Any], set[Path]]]:
    """Ownership of fields the object no longer has is dropped (a field set to null by a
    merge patch is nobody's any more)."""
    return [(e, {p for p in have if value_at(obj, p) is not _MISSING}) for e, have in owned]


def _key(entry: dict[str, Any]) -> tuple[str, str, str | None]:
    return (entry.get("manager", ""), entry.get("operation", ""), entry.get("subresource"))
