"""The LMDB environment: stream configuration, committed tails, producer state, index,
and keyed values (``ops.PutKeyedValue``).

The databases, keys and values are the format's (``stream_format.meta``).

LMDB is the index, the segment files are the data. Every value written here
in the normal path also travels in the batch's WAL frame, so LMDB runs with
``metasync=False`` (one flush per commit): a commit lost to a power cut is
redone from the WAL on the next start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import lmdb

from stream_format.meta import ALL_DB_NAMES
from stream_format.wal import DELETE, DELETE_PREFIX, PUT, Entry
from stream_server.engine import fsio


class Metadata:
    """The LMDB environment and its named databases."""

    def __init__(self, path: Path, map_size: int) -> None:
        fsio.mkdir(path)
        self.path = path
        self.env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=len(ALL_DB_NAMES) + 2,
            sync=True,
            metasync=False,
            readahead=False,
            max_readers=256,
        )
        # In a transaction begun here: py-lmdb's open_db without one waits for LMDB's
        # writer lock holding the GIL, which would freeze the event loop (and the
        # probes it answers) while another process holds that lock.
        with self.env.begin(write=True) as txn:
            self.dbs = {num: self.env.open_db(name, txn=txn) for num, name in ALL_DB_NAMES.items()}

    @classmethod
    def read_only(cls, path: Path) -> Metadata:
        """The environment opened by another process for reading only (a worker's
        catch-up reads, ``workers/local_reads.py``): no write transaction, no database
        created; it takes a reader slot in the lock file, so the writer keeps the pages
        its transactions read."""
        meta = cls.__new__(cls)
        meta.path = path
        meta.env = lmdb.open(
            str(path), readonly=True, lock=True, max_dbs=len(ALL_DB_NAMES) + 2, readahead=False
        )
        # Opened outside any transaction of ours, as the Spark reader opens them: a handle
        # opened in a read transaction lives only as long as that transaction.
        meta.dbs = {num: meta.env.open_db(name, create=False) for num, name in ALL_DB_NAMES.items()}
        return meta

    def grow(self) -> None:
        """Double the map after MapFullError; LMDB allows this between transactions."""
        self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def apply(self, txn: lmdb.Transaction, entries: list[Entry]) -> None:
        """Apply WAL-style metadata entries (PUT / DELETE / DELETE_PREFIX) in order."""

        for entry in entries:
            kind = entry[0]
            if kind == PUT:
                txn.put(entry[2], entry[3], db=self.dbs[entry[1]])
            elif kind == DELETE:
                txn.delete(entry[2], db=self.dbs[entry[1]])
            elif kind == DELETE_PREFIX:
                delete_prefix(txn, self.dbs[entry[1]], entry[2])

    @contextlib.contextmanager
    def write(self) -> Iterator[lmdb.Transaction]:
        """A write transaction; the I/O module hears of its commit."""
        with self.env.begin(write=True) as txn:
            yield txn
        fsio.lmdb_committed(self.path)

    def sync(self) -> None:
        self.env.sync(True)
        fsio.lmdb_synced(self.path)

    def close(self) -> None:
        self.env.close()


def delete_prefix(
    txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes, start: bytes | None = None
) -> None:
    """Delete every key that starts with ``prefix`` (from ``start`` on, if given)."""
    cur = txn.cursor(db=db)
    if not cur.set_range(start or prefix):
        return
    while bytes(cur.key()).startswith(prefix):
        if not cur.delete():
            break
        if not cur.key():
            break
