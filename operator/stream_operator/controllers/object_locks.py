"""One lock per DurableStream: every reconcile and status write for an object runs under
it and starts from a fresh read, so a round holding an older copy can neither apply an
old spec over a new one nor write an old outcome back into the status."""

from __future__ import annotations

import threading
from collections import defaultdict

_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def object_lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[(namespace, name)]
