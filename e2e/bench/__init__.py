"""The side-by-side benchmark (``python e2e/bench/run.py``), as a package.

- ``servers``: the processes measured (ours, ours at a baseline ref, the
  Node reference, the HTTP ceiling), on ``testkit.servers``, and what each
  needs installed;
- ``client``: raw keep-alive HTTP connections, the epoll fill, wrk;
- ``workloads``: one function per workload, each returning a typed result;
- ``many_streams``: N small streams on one server (fill, stop, restart,
  kill -9), with our checkpoint windows seen in its data directory;
- ``replicated``: the 3-replica set (testkit.replicaset) against single-node,
  with the standbys' lag and a check of every replica's content;
- ``workers``: ours with ``--workers N`` against ``--workers 1`` (CPU per append
  of every process and of the writer, the model of more cores, the ceiling in
  as many processes);
- ``report``: the rows, the table and the JSON document;
- ``machine``: the disk probe, file limits, versions;
- ``run``: the command line and the driver.

``profile_shares.py``, ``engine_read.py``, ``spark_read.py`` and
``ceiling_app.py`` are scripts of their own.
"""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
