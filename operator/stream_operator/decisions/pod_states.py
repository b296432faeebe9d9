"""Why a server pod is not ready, read from its container states as the kubelet reports them.

The StatefulSet counts ready pods; only the pods say why the others are not.
A container that keeps exiting waits in ``CrashLoopBackOff`` with the last
run's exit code and termination message in ``lastState.terminated`` (the end
of its log, under ``terminationMessagePolicy: FallbackToLogsOnError``); one
the kernel killed for memory has the reason ``OOMKilled``; an image that
cannot be pulled waits in ``ImagePullBackOff``. A pod no node takes has no
container states at all: the scheduler writes its reason on the pod's
``PodScheduled`` condition (status False, reason ``Unschedulable`` with "0/3 nodes
are available: ..."; ``SchedulingGated`` while a gate holds it). Pure functions
over pods as the API lists them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PodTrouble:
    """Why a server pod does not run: a container state's reason and what it said."""

    reason: str
    message: str


# Waiting reasons that will not pass by themselves (ContainerCreating and
# PodInitializing do): each is a Ready=False reason as it stands.
STUCK_WAITING = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
OOM_KILLED = "OOMKilled"
# PodScheduled=False reasons the scheduler writes (k8s.io/api core/v1 PodReasonUnschedulable,
# PodReasonSchedulingGated): the pod waits for a node, and the message says what is missing.
NOT_SCHEDULED = frozenset({"Unschedulable", "SchedulingGated"})
SERVER_CONTAINER = "server"
MESSAGE_LIMIT = 300


def _said(message: str | None) -> str:
    """The line of a termination message that says why (its last error, or last line).

    With ``FallbackToLogsOnError`` the message is the end of the log, one JSON object
    a line in the default log format: the server's refusal is its last error.
    """
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    for i, line in enumerate(reversed(lines)):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("level") in ("error", "critical"):
            return str(entry.get("msg", line))[:MESSAGE_LIMIT]
        if i == 0:  # a command's last word: a log line, or an error printed as JSON
            last = str(entry.get("msg") or entry.get("error") or line)
    return last[:MESSAGE_LIMIT]


def _init_trouble(name: str | None, status: dict[str, Any]) -> PodTrouble | None:
    """An init container that keeps failing (the restore of ``bootstrap.recovery``):
    the server container waits in PodInitializing, which says nothing, and never
    starts. Named as kubectl shows it (``Init:CrashLoopBackOff``)."""
    for cs in status.get("initContainerStatuses") or []:
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        waiting = (state.get("waiting") or {}).get("reason")
        if waiting not in STUCK_WAITING:
            continue
        ended = last.get("terminated") or {}
        what = (state.get("waiting") or {}).get("message") or waiting
        if ended:
            said = _said(ended.get("message"))
            what = f"the {cs.get('name')} init container exited with code {ended.get('exitCode')}"
            what += f" ({int(cs.get('restartCount') or 0)} restarts)" + (
                f": {said}" if said else ""
            )
        return PodTrouble(f"Init:{waiting}", f"pod {name}: {what}"[: MESSAGE_LIMIT + 100])
    return None


def _unscheduled(name: str | None, status: dict[str, Any]) -> PodTrouble | None:
    """A pod the scheduler could not place, with the scheduler's own words (which nodes
    it tried and what each lacked), pointing at the spec fields that decide placement."""
    for cond in status.get("conditions") or []:
        if cond.get("type") != "PodScheduled" or cond.get("status") != "False":
            continue
        reason = str(cond.get("reason") or "")
        if reason in NOT_SCHEDULED:
            said = str(cond.get("message") or reason)[:MESSAGE_LIMIT]
            where = "spec.scheduling, spec.resources.requests and spec.storage"
            return PodTrouble(reason, f"pod {name} is not scheduled: {said} (see {where})")
    return None


def pod_trouble(pods: Sequence[dict[str, Any]]) -> PodTrouble | None:
    """The first server pod (by name) that is not ready for a reason that will not pass."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name") or ""):
        name = (pod.get("metadata") or {}).get("name")
        if trouble := _unscheduled(name, pod.get("status") or {}):
            return trouble
        if trouble := _init_trouble(name, pod.get("status") or {}):
            return trouble
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != SERVER_CONTAINER or cs.get("ready"):
                continue
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            waiting = (state.get("waiting") or {}).get("reason")
            ended = state.get("terminated") or last.get("terminated") or {}
            restarts = int(cs.get("restartCount") or 0)
            if ended.get("reason") == OOM_KILLED:
                return PodTrouble(
                    OOM_KILLED,
                    f"pod {name}: the server was killed for using more memory than its limit "
                    f"({restarts} restarts); raise spec.resources.limits.memory "
                    "(see docs/kubernetes.md, Sizing)",
                )
            if waiting in STUCK_WAITING:
                if ended:
                    said = _said(ended.get("message"))
                    what = f"the server exited with code {ended.get('exitCode')}"
                    what += f" ({restarts} restarts)" + (f": {said}" if said else "")
                else:
                    what = (state.get("waiting") or {}).get("message") or waiting
                return PodTrouble(waiting, f"pod {name}: {what}"[: MESSAGE_LIMIT + 100])
    return None
