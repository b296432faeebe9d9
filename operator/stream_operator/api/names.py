"""The DurableStream names the rendered objects can carry, checked before anything is
rendered (the CRD's root CEL rules check the same, ``crd_rules``).

A DurableStream's name is only a DNS subdomain (253 characters, dots allowed), but it
becomes:

- the StatefulSet's name, whose pods are labelled ``controller-revision-hash:
  <name>-<hash>``, the hash up to 10 characters, and a label value is at most 63: so
  at most 63 - 1 - 10 = 52 characters (the limit the StatefulSet controller imposes;
  its pods ``<name>-<ordinal>`` are host names, 63, within it);
- Services ``<name>``, ``<name>-headless`` and ``<name>-replicas``: DNS-1035 labels
  (lower-case letters, digits and ``-``, a letter first, no dots), 54 characters for
  the suffixed ones, so the 52 above is the tighter bound.

Everything else it names (ConfigMaps, the Lease, Secrets, claims ``data-<name>-<n>``)
is a DNS subdomain and fits.
"""

from __future__ import annotations

import re

# controller-revision-hash: <name>-<10-character hash> in a 63-character label value.
MAX_LENGTH = 63 - len("-") - 10
# A DNS-1035 label, what a Service's name must be.
PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
INVALID = "InvalidName"  # the Accepted condition's reason, and the Warning's


def refused(name: str) -> str | None:
    """Why ``name`` cannot be rendered into a StatefulSet and Services, or None."""
    if len(name) > MAX_LENGTH:
        return (
            f"the name {name!r} has {len(name)} characters: at most {MAX_LENGTH} fit "
            "(the StatefulSet's pods carry <name>-<10-character revision hash> in a "
            "63-character label); nothing is rendered"
        )
    if not re.match(PATTERN, name):
        return (
            f"the name {name!r} is not a DNS-1035 label (lower-case letters, digits and "
            "'-', a letter first, no dots), which the Services named after it must be; "
            "nothing is rendered"
        )
    return None


def crd_rules() -> list[dict[str, str]]:
    """The CRD's root ``x-kubernetes-validations`` on ``metadata.name`` (the same limits)."""
    return [
        {
            "rule": f"self.metadata.name.size() <= {MAX_LENGTH}",
            "message": f"metadata.name: at most {MAX_LENGTH} characters (the StatefulSet's "
            "pods carry <name>-<10-character revision hash> in a 63-character label)",
        },
        {
            "rule": f"self.metadata.name.matches('{PATTERN}')",
            "message": "metadata.name: a DNS-1035 label (lower-case letters, digits and '-', "
            "a letter first, no dots): the Services are named after it",
        },
    ]
