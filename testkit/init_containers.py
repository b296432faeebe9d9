"""A pod's status while its init containers run, as the kubelet reports it: phase
Pending, the server container waiting in PodInitializing, and one
``initContainerStatuses`` entry per init container (done: terminated Completed;
running; failed: waiting in CrashLoopBackOff with the failed run as ``lastState``;
not yet run: waiting in PodInitializing). Once they are all done, every entry is
terminated Completed and the pod's status is its server container's."""

from __future__ import annotations

from typing import Any


def init_status(
    server: dict[str, Any],
    inits: list[dict[str, Any]],
    step: int | None,
    restarts: int,
    last: dict[str, Any] | None,
    backing_off: bool,
) -> dict[str, Any]:
    """The fields the init containers add to a pod's status; ``step`` is the one running
    (None: all done), ``restarts`` and ``last`` its failed runs'."""
    entries = []
    for i, init in enumerate(inits):
        state: dict[str, Any]
        if step is None or i < step:
            state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        elif i > step:
            state = {"waiting": {"reason": "PodInitializing"}}
        elif backing_off:
            why = f"back-off restarting failed container={init['name']}"
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": why}}
        else:
            state = {"running": {}}
        entries.append(
            {
                "name": init["name"],
                "image": init.get("image", ""),
                "imageID": "",
                "containerID": "",
                "ready": step is None or i < step,
                "restartCount": restarts if i == step else 0,
                "state": state,
                "lastState": {"terminated": last} if last and i == step else {},
            }
        )
    fields: dict[str, Any] = {"initContainerStatuses": entries}
    if step is not None:
        fields["phase"] = "Pending"
        fields["containerStatuses"] = [
            {
                "name": server["name"],
                "ready": False,
                "restartCount": 0,
                "image": server["image"],
                "imageID": "",
                "containerID": "",
                "state": {"waiting": {"reason": "PodInitializing"}},
                "lastState": {},
            }
        ]
    return fields


STATES = ("waiting", "running", "terminated")


def replacing_states(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` as a strategic merge patch that replaces each container's ``state``:
    the states it leaves out set to null, as the kubelet's two-way patch from the old
    status deletes them (a merged ``{"waiting": ..., "running": {}}`` would keep a
    container in PodInitializing or CrashLoopBackOff once it runs)."""
    out = dict(status)
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in out:
            out[key] = [
                {**cs, "state": {**dict.fromkeys(STATES), **(cs.get("state") or {})}}
                for cs in out[key]
            ]
    return out
