"""What a replica cluster's server keeps in its data directory about the archive it
follows, and the term it writes under once promoted (docs/replica-clusters.md).

Two LMDB keys (DB_INFO), both JSON:

- ``archive_followed``: ``{"url", "lsn", "history", "source_term"}``, written by the
  follower in the same LMDB transaction as the metadata of the frames it applies
  (``followed_entry``), so that it can never be ahead of them, nor behind them for
  longer than a crash between a WAL flush and its LMDB commit (recovery then
  replays the frames, and ``Engine.lsn`` says how far they go). ``history`` is the
  ancestry the follower took its frames along, ``[[term, first lsn], ...]``;
  ``source_term`` the highest term the source's archive had named.
- ``archive_term``: ``{"term", "history", "followed"}``, written once, at the first
  start without ``--archive-follow`` (the promotion, ``promote``): the term this
  directory's own frames are archived under, above every term the source used,
  and the history that leads to it. ``single_node_term`` reads it for the archiver
  (term 0, history ``[[0, 1]]``, when the directory never followed an archive).

A promoted directory refuses to archive to the archive it followed: two primaries
writing one archive is what the promotion's new term and new location rule out.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from stream_format import wal as walmod
from stream_format.archive import SINGLE_NODE_HISTORY, History
from stream_format.meta import DB_INFO
from stream_server.engine.engine import Engine
from stream_server.engine.replica import KEY_FOLLOWED, KEY_SINGLE_NODE_TERM, holds_data

log = logging.getLogger("stream_server.archive")

KEY_TERM = KEY_SINGLE_NODE_TERM  # this module's name for it

SINGLE_NODE: tuple[int, History] = (0, SINGLE_NODE_HISTORY)  # never followed an archive


class PromotionRefused(RuntimeError):
    """A promoted directory may not archive where its source archives."""


class FollowRefused(RuntimeError):
    """This data directory may not follow that archive: it holds other data."""


@dataclass
class Followed:
    """How far this directory has followed an archive."""

    url: str
    lsn: int = 0  # the last frame applied
    history: History = field(default_factory=list)  # the terms the frames were taken along
    source_term: int = 0  # the highest term the source's archive named

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "url": self.url,
                "lsn": self.lsn,
                "history": self.history,
                "source_term": self.source_term,
            }
        ).encode()

    @staticmethod
    def from_json(raw: bytes) -> Followed:
        doc = json.loads(raw)
        return Followed(
            str(doc["url"]),
            int(doc["lsn"]),
            _history(doc["history"]),
            int(doc.get("source_term", 0)),
        )

    def took(self, term: int, lsn: int) -> None:
        """Frame ``lsn`` was applied from ``term``'s frames."""
        if not self.history or self.history[-1][0] != term:
            self.history.append((term, lsn))
        self.lsn = lsn
        self.source_term = max(self.source_term, term)


def _history(raw: Any) -> History:
    return [(int(t), int(lsn)) for t, lsn in raw]


def _get(engine: Engine, key: bytes) -> bytes | None:
    assert engine.meta is not None
    with engine.meta.env.begin() as txn:
        raw = txn.get(key, db=engine.meta.dbs[DB_INFO])
    return None if raw is None else bytes(raw)


def read_followed(engine: Engine) -> Followed | None:
    """What this directory followed, or None when it never followed an archive. The
    lsn is at least the engine's (frames replayed from the WAL after a crash)."""
    raw = _get(engine, KEY_FOLLOWED)
    if raw is None:
        return None
    followed = Followed.from_json(raw)
    followed.lsn = max(followed.lsn, engine.lsn)
    return followed


def resume(engine: Engine, url: str, restored: tuple[int, History] | None) -> Followed:
    """Where a follower of ``url`` starts on this directory (once the engine is open):
    where it stopped; after ``restored`` (the last lsn of the base backup just restored
    into it, and the terms its frames were taken along); or, on an empty directory,
    before lsn 1. FollowRefused for a
    directory holding anything else: data of its own, a promoted replica's, or
    another archive's frames (following would mix two histories)."""
    found = read_followed(engine)
    if found is not None:
        if not _same_archive(found.url, url):
            raise FollowRefused(
                f"this data directory follows the archive {found.url}, not {url}: to follow "
                "another archive, start on an empty data directory"
            )
        return found
    if restored is not None:
        # Just restored from the archive it follows: that archive's history wins, also
        # over the term record a promoted set's backup carries (a demoted set rebuilt
        # from its new primary's backup); ``forget_promotion`` drops that record.
        lsn, history = restored
        return Followed(url, lsn, list(history))
    if _get(engine, KEY_TERM) is not None:
        raise FollowRefused(
            "this data directory was promoted (it has written on its own): it cannot follow "
            "an archive again; start the follower on an empty data directory"
        )
    if holds_data(engine):
        raise FollowRefused(
            "this data directory holds data that is not the archive's: a replica cluster's "
            "server starts on an empty data directory (docs/replica-clusters.md)"
        )
    return Followed(url, engine.lsn)


def followed_entry(followed: Followed) -> walmod.Entry:
    """The LMDB change recording ``followed``: added to the applied frames' own."""
    return (walmod.PUT, DB_INFO, KEY_FOLLOWED, followed.to_json())


def forget_promotion() -> walmod.Entry:
    """The LMDB change dropping a promoted set's term record, written with the follow
    record of a directory restored from that set's backup: it follows now, and a later
    promotion takes a term above its new source's (``promoted_history``)."""
    return (walmod.DELETE, DB_INFO, KEY_TERM)


def single_node_term(engine: Engine) -> tuple[int, History]:
    """The term a single node archives its frames under and that term's history:
    ``(0, [[0, 1]])``, or after a promotion the term above its source's."""
    raw = _get(engine, KEY_TERM)
    if raw is None:
        return SINGLE_NODE
    doc = json.loads(raw)
    return int(doc["term"]), _history(doc["history"])


def promoted_history(followed: Followed) -> tuple[int, History]:
    """The term above every term the source named, and its history: the terms the
    frames were taken along up to the last one applied, then the new term from the
    next lsn."""
    term = max([followed.source_term, *(t for t, _ in followed.history)]) + 1
    taken = [(t, first) for t, first in followed.history if first <= followed.lsn]
    return term, [*taken, (term, followed.lsn + 1)]


def promote(engine: Engine, archive_url: str) -> None:
    """A start without ``--archive-follow`` (run once the engine is open, before it
    writes): a directory that followed an archive becomes a writable single node's
    whose frames come after every frame it applied, under a term above the source's
    (recorded once, flushed, and the follow record dropped in the same transaction).
    On every start it keeps the engine's next lsn past the promotion's first lsn (a
    clean shutdown leaves an empty WAL, from which recovery learns no lsn).
    PromotionRefused when ``archive_url`` is the followed archive."""
    raw = _get(engine, KEY_TERM)
    followed = read_followed(engine)
    if raw is None and followed is None:
        return  # never followed an archive
    url = str(json.loads(raw).get("followed", "")) if raw is not None else ""
    if followed is not None:
        url = followed.url
    if archive_url and _same_archive(archive_url, url):
        raise PromotionRefused(
            f"this data directory followed the archive {url}: a promoted server must not "
            "archive where its source does (two primaries would write one archive); give "
            "it another --archive-url (docs/replica-clusters.md)"
        )
    if raw is not None:
        first = int(json.loads(raw)["history"][-1][1])
    else:
        assert followed is not None
        term, history = promoted_history(followed)
        first = history[-1][1]
        record = {"term": term, "history": history, "followed": url}
        engine.write_metadata(
            [
                (walmod.PUT, DB_INFO, KEY_TERM, json.dumps(record).encode()),
                (walmod.DELETE, DB_INFO, KEY_FOLLOWED),
            ],
            flush=True,
        )
        log.warning(
            "promoted: this directory followed %s up to lsn %d; it now writes on its own "
            "under term %d from lsn %d",
            url,
            followed.lsn,
            term,
            first,
            extra={"fields": {"event": "archive_promoted", "term": term, "lsn": first}},
        )
    engine.lsn = max(engine.lsn, first - 1)


def _same_archive(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")
