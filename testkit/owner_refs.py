"""The OwnerReferencesPermissionEnforcement admission plugin's checks, as RBAC requests.

kube-apiserver (plugin/pkg/admission/gc/gc_admission.go; on by default in OpenShift,
and wherever ``--enable-admission-plugins`` names it) authorizes two more things on
a write that changes an object's ``metadata.ownerReferences``:

- an update (not a create: whoever may create an object may give it owners) needs
  ``delete`` on the object itself ("cannot set an ownerRef on a resource you can't
  delete");
- each owner reference that becomes ``blockOwnerDeletion: true`` (new, or false
  before) needs ``update`` on the owner's ``finalizers`` subresource, by the owner's
  name ("cannot set blockOwnerDeletion if an ownerReference refers to a resource you
  can't set finalizers on").

``testkit.kube.ApiServer`` records them beside the request itself, so that the RBAC
checks (``testkit.rbac``) ask the chart's roles for them as the real API server would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Refs = list[Mapping[str, Any]]


def _refs(obj: Mapping[str, Any] | None) -> Refs:
    return list(((obj or {}).get("metadata") or {}).get("ownerReferences") or [])


def changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether the write changes the owner references (the plugin's
    ``isChangingOwnerReference``: a create with any, or an update with other ones)."""
    if old is None:
        return bool(_refs(new))
    return _refs(old) != _refs(new)


def newly_blocking(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Refs:
    """The owner references that block their owner's deletion now and did not before
    (the plugin's ``newBlockingOwnerDeletionRefs``: matched by uid)."""
    before = {r.get("uid"): bool(r.get("blockOwnerDeletion")) for r in _refs(old)}
    return [
        ref
        for ref in _refs(new)
        if ref.get("blockOwnerDeletion") and not before.get(ref.get("uid"), False)
    ]


def owner_resource(
    ref: Mapping[str, Any], kinds: Mapping[str, tuple[str, str, str]]
) -> tuple[str, str]:
    """The owner's API group and plural (``kinds``: kind -> group, version, plural), as the
    plugin's REST mapper finds them; an unknown kind by its lower-cased plural."""
    if ref.get("kind") in kinds:
        group, _, plural = kinds[ref["kind"]]
        return group, plural
    api_version = str(ref.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    return group, f"{str(ref.get('kind') or '').lower()}s"
