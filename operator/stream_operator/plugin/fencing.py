"""The ``streams.pyds.dev/fenced-instances`` list after a ``fence`` or ``unfence``: pure.

The annotation is a JSON list of pod names, ``["*"]`` for every pod, as CloudNativePG's
``cnpg.io/fencedInstances``, and follows its rules: with every pod fenced, fencing one
more changes nothing and unfencing one alone is refused (unfence all, then fence the
ones to keep); an empty list means the annotation goes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from stream_operator.plugin import FENCE_ALL, PluginError


def fenced_list(raw: str | None) -> list[str]:
    """The annotation's pod names; a value that is not a JSON list of strings is refused,
    not overwritten: someone wrote it by hand and should see what it says."""
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PluginError(f"the fenced-instances annotation is not a JSON list of names: {raw}")
    return value


def fence(current: Sequence[str], pods: Sequence[str], *, all_pods: bool) -> list[str]:
    """The list with ``pods`` (or every pod) fenced too."""
    if all_pods or FENCE_ALL in current:
        return [FENCE_ALL]
    return sorted({*current, *pods})


def unfence(current: Sequence[str], pods: Sequence[str], *, all_pods: bool) -> list[str]:
    """The list without ``pods`` (or empty); refused for one pod while all are fenced."""
    if all_pods:
        return []
    if FENCE_ALL in current:
        raise PluginError(
            'every pod is fenced ("*"): unfence --all, then fence the pods to keep fenced'
        )
    return [p for p in current if p not in set(pods)]
