"""The kubelet's downward API for a container's resources (``resourceFieldRef``).

The kubelet divides the container's limit (or request) by the divisor and rounds up, so a
CPU limit of 2500m with divisor 1 reads "3"; a container with no CPU limit reads the
node's allocatable CPUs, here this machine's count. Only CPU is needed so far (the
operator's DS_WORKERS); anything else raises, so a test cannot rely on a value the
stand-in made up.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from typing import Any

CPU_FIELDS = ("limits.cpu", "requests.cpu")


def cpu_quantity(value: Any) -> Fraction:
    """A Kubernetes CPU quantity in cores: ``2``, ``"2"``, ``"2500m"``, ``"0.5"``."""
    text = str(value).strip()
    if text.endswith("m"):
        return Fraction(text[:-1]) / 1000
    return Fraction(text)


def resource_field_value(container: dict[str, Any], ref: dict[str, Any]) -> str:
    """What the kubelet puts in a variable whose ``valueFrom`` is ``resourceFieldRef``
    ``ref``, for ``container`` (the pod's container the reference names)."""
    resource = ref["resource"]
    if resource not in CPU_FIELDS:
        raise NotImplementedError(f"the kubelet stand-in reads no {resource}")
    kind, _ = resource.split(".")
    given = (container.get("resources") or {}).get(kind, {}).get("cpu")
    cores = cpu_quantity(given) if given is not None else Fraction(os.cpu_count() or 1)
    return str(math.ceil(cores / cpu_quantity(ref.get("divisor", "1"))))
