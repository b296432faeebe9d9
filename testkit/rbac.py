"""What RBAC objects grant, checked against the requests the emulated API server saw.

kube-apiserver's RBAC authorizer, for the part the chart uses: a ClusterRole
bound by a ClusterRoleBinding grants in every namespace and on cluster-scoped
objects; a Role (or a ClusterRole) bound by a RoleBinding grants in the
binding's namespace only. Rules match on API group, resource (``plural`` or
``plural/subresource``) and verb; no wildcards, no resourceNames (the chart
uses neither, and ``grants`` refuses them rather than guess).
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
            assert "resourceNames" not in rule, "resourceNames: not modelled here"
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"a wildcard in {field}: not least privilege"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add(Grant(verb, group, resource, where))
    return out


def allowed(call: Call, granted: set[Grant]) -> bool:
    return Grant(call.verb, call.group, call.resource, None) in granted or (
        call.namespace is not None
        and Grant(call.verb, call.group, call.resource, call.namespace) in granted
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
    return grant.namespace is None or call.namespace == grant.namespace
