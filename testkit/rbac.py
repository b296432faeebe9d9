"""What RBAC objects grant, checked against the requests the emulated API server saw.

kube-apiserver's RBAC authorizer, for the part the chart uses: a ClusterRole
bound by a ClusterRoleBinding grants in every namespace and on cluster-scoped
objects; a Role (or a ClusterRole) bound by a RoleBinding grants in the
binding's namespace only. Rules match on API group, resource (``plural`` or
``plural/subresource``) and verb, and a rule with ``resourceNames`` only
requests that name one of them (a create never does; a list or watch only by
``fieldSelector=metadata.name``: ``testkit.kube.Call.name``). No wildcards
(``grants`` refuses them rather than guess).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from testkit.kube import Call


class Grant(NamedTuple):
    """One permission: ``namespace`` None means in every namespace and cluster-wide."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None = None  # only requests naming this object (a rule's resourceNames)


def grants(docs: Iterable[dict[str, Any]], account: str, account_namespace: str) -> set[Grant]:
    """Everything the rendered RBAC ``docs`` grant the ServiceAccount ``account``."""
    docs = [d for d in docs if d]
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": account_namespace}
        if not any(
            all(s.get(k) == v for k, v in subject.items()) for s in binding.get("subjects") or []
        ):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role_ns = where if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds a missing {ref}"
        for rule in role.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"a wildcard in {field}: not least privilege"
            names = rule.get("resourceNames") or [None]
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in names:
                            out.add(Grant(verb, group, resource, where, name))
    return out


def allowed(call: Call, granted: set[Grant]) -> bool:
    names = {None} if call.name is None else {None, call.name}
    spaces = {None} if call.namespace is None else {None, call.namespace}
    return any(
        Grant(call.verb, call.group, call.resource, space, name) in granted
        for space in spaces
        for name in names
    )


def denied(calls: Iterable[Call], granted: set[Grant]) -> list[Call]:
    """The requests the granted permissions would have refused (403)."""
    return sorted({c._replace(agent="") for c in calls if not allowed(c, granted)})


def unused(calls: Iterable[Call], granted: set[Grant]) -> list[Grant]:
    """The permissions no request needed."""
    calls = list(calls)
    return sorted(g for g in granted if not any(_needs(c, g) for c in calls))


def _needs(call: Call, grant: Grant) -> bool:
    if (call.verb, call.group, call.resource) != (grant.verb, grant.group, grant.resource):
        return False
    if grant.name is not None and call.name != grant.name:
        return False
    return grant.namespace is None or call.namespace == grant.namespace
