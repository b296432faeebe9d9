"""One condition of a DurableStream's status, as the API types it.

Here, below the renderers and the decisions, because both say conditions: a
renderer the one its objects imply (``certificates``, ``disruptions``), a decision
the ones it observes (``status``, ``lifecycle``, ``replica_cluster``).
"""

from __future__ import annotations


def condition(ctype: str, ok: bool, reason: str, message: str) -> dict[str, str]:
    return {
        "type": ctype,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
    }
