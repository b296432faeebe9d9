"""One TLS context for every httpx client of the test process that verifies by default.

httpx builds a new ``ssl.SSLContext`` for each client and loads the CA bundle into it:
36 ms of CPU (47 on a loaded machine), paid by every ``httpx.get`` and so by every poll
of a wait loop. Two process-test modules (tests/archive/test_restore.py and
tests/replication/test_switchover.py) made 190 clients, 8.9 CPU s of their pytest
process. A context that verifies against the default bundle is the same for all of
them, and a context may be shared by any number of connections, so the transports get
one, made once per bundle setting (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, as httpx reads
them). A client given ``verify=`` a context or False, a client certificate, or
``trust_env=False`` is built as httpx builds it.

httpx has no public default for this: the function replaced is the one its transports
call (httpx/_transports/default.py). If an httpx release renames it, loading this
plugin fails, naming it, rather than the suite quietly paying the CPU again.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from httpx._transports import default as transports

_made = transports.create_ssl_context  # AttributeError here: see the docstring
_shared: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
    if verify is not True or cert is not None or not trust_env:
        return _made(verify=verify, cert=cert, trust_env=trust_env)
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if key not in _shared:
        _shared[key] = _made(verify=True, cert=None, trust_env=True)
    return _shared[key]


transports.create_ssl_context = create_ssl_context
