"""A replica set's identity, and what a data directory's content lets its replica do
(docs/replication.md, "A set's identity").

A set has an id (``uuid4().hex``), kept in each member's data directory (the
``SET_ID`` file, ``engine.data_dir.write_set_id``) and in the Lease (annotation
``streams.pyds.dev/set-id``). What a directory holds decides what its replica may do:

- **empty** (no stream or keyed value ever written, no replica position): it may create
  the Lease only if it is the set's bootstrap replica (``replication_bootstrap``;
  empty: any replica may), else it waits for the Lease; it joins any set, adopting
  the Lease's id before it follows (nothing to lose);
- **single-node data** (data, but no set id and no replica position): it may create
  the Lease (minting an id, written to the directory first): that is how a single
  server becomes a replica set, keeping its data. It never joins an existing set.
  A member's directory becomes single-node data when a single node starts on it
  (``leave``, before it writes anything: its writes move no position);
- **a member of set X** (a set id; or, from before set ids, a replica position
  without one, which adopts the Lease's id): it may create the Lease with X, and
  follows or leads only a set whose Lease names X.

A replica that may not join refuses, says why (``problem``, logged once as an
error), follows nobody, is never eligible to lead, and so never acknowledges
anything: its data is left as it is. Data that was acknowledged is never wiped
because of an identity mismatch; moving the directory away is a human's call.

The primary checks the set id a follower sends with every stream and
snapshot request (``set``): another set's follower gets 409 ``other set``; one
with no set id (a version from before set ids) at (0, 0), while the primary's
own position is not, is told to re-copy (``refusal``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Literal

from stream_format.layout import Layout, valid_set_id
from stream_server.engine.data_dir import remove_set_id, write_set_id
from stream_server.engine.replica import ReplicaHooks, holds_data, leave_set

if TYPE_CHECKING:
    from stream_server.engine.engine import Engine

log = logging.getLogger("stream_server.replication")

Kind = Literal["empty", "single-node", "member"]
Position = tuple[int, int]

WAITING = "waiting for the set's primary: empty storage and not the bootstrap replica"
OTHER_SET = "other set"


def mint() -> str:
    return uuid.uuid4().hex


class SetIdentity:
    """What this replica's data directory holds, and its set id; loaded once recovery
    is done (``load``), changed only by this replica (``settle``, ``forget``)."""

    def __init__(self, layout: Layout, name: str, bootstrap: str = "") -> None:
        self.layout = layout
        self.name = name
        self.bootstrap = bootstrap
        self.set_id = ""
        self.data = False  # streams or keyed values were written here
        self.positioned = False  # a replica position is recorded (a set's history)
        self.problem: str | None = None  # why this replica does not follow or lead
        self._minted = ""  # an id minted here for a Lease not yet known to exist

    def load(self, engine: Engine, hooks: ReplicaHooks) -> None:
        """Read the set id and what the directory holds (a worker thread, after
        recovery and ``hooks.load``)."""
        self.set_id = self.layout.read_set_id()
        if self.set_id == hooks.left:
            self.set_id = ""  # the file of a set left, whose removal a crash stopped
        self.data = holds_data(engine)
        self.positioned = hooks.durable != (0, 0)

    @property
    def kind(self) -> Kind:
        if not self.data and not self.positioned:
            return "empty"
        if not self.set_id and not self.positioned:
            return "single-node"
        return "member"

    # ------------------------------------------------------------ decisions

    def may_create(self) -> str | None:
        """Why this replica may not create the set's Lease (None: it may)."""
        if self.kind == "empty" and self.bootstrap and self.bootstrap != self.name:
            return WAITING
        return None

    def mismatch(self, lease_set_id: str) -> str | None:
        """Why this directory may not follow or lead the set whose Lease names
        ``lease_set_id`` (None: it may, adopting that id if it has none)."""
        named = f"set {lease_set_id}" if lease_set_id else "the set of this Lease"
        kind = self.kind
        if kind == "single-node":
            return (
                f"this data directory holds single-node data; it cannot join {named}: "
                "move it away to re-copy"
            )
        if lease_set_id and not valid_set_id(lease_set_id):
            return f"the Lease's set id {lease_set_id[:80]!r} is not a set id: fix the Lease"
        if kind == "member" and self.set_id and lease_set_id and self.set_id != lease_set_id:
            return (
                f"this data directory holds set {self.set_id}'s data; it cannot join "
                f"{named}: move it away to re-copy"
            )
        return None

    # -------------------------------------------------------------- changes

    def refuse(self, why: str) -> None:
        """Record why this replica does not join (logged once per reason)."""
        if self.problem != why:
            log.error("%s", why)
        self.problem = why

    def wait(self, why: str) -> None:
        if self.problem != why:
            log.info("%s", why)
        self.problem = why

    def clear(self) -> None:
        self.problem = None

    async def settle(self, lease_set_id: str) -> str:
        """The set id to write into the Lease, once this directory holds it: the
        Lease's own (adopted when the directory has none: an empty replica, or a
        member from before set ids), else this directory's, minted now when it has
        none (single-node data starting a set, an empty bootstrap replica, or a
        primary from before set ids). The file is durable before the id is used."""
        if lease_set_id:
            if self.set_id != lease_set_id:
                why = self.mismatch(lease_set_id)
                if why is not None:
                    raise ValueError(why)
                await asyncio.to_thread(write_set_id, self.layout, lease_set_id)
                log.info("this data directory joins replica set %s", lease_set_id)
                self.set_id = lease_set_id
            if self._minted == lease_set_id:
                self._minted = ""  # the Lease names it: ours for good
            return lease_set_id
        if not self.set_id:
            new = mint()
            await asyncio.to_thread(write_set_id, self.layout, new)
            log.info("replica set id %s minted for this data directory", new)
            self.set_id = self._minted = new
        return self.set_id

    async def forget(self) -> None:
        """Undo ``settle``'s mint when the Lease it was meant for was not created
        (another replica was first): the directory is again what it was."""
        if self._minted and self._minted == self.set_id:
            await asyncio.to_thread(remove_set_id, self.layout)
            self.set_id = self._minted = ""

    async def join(self, lease_set_id: str) -> str | None:
        """Before following the primary of the set ``lease_set_id``: the reason this
        replica may not (recorded as ``problem``), or None once the directory holds
        that set id (adopted when it had none)."""
        why = self.mismatch(lease_set_id)
        if why is not None:
            self.refuse(why)
            return why
        if lease_set_id and self.set_id != lease_set_id:
            await self.settle(lease_set_id)
        self.clear()
        return None


def leave(engine: Engine) -> None:
    """A single node starts on this directory (no ``--replication-lease``): if it is a
    set's member, it leaves the set before anything is written (``leave_set``), and
    says so. Its writes from now on are single-node data: the set's other members
    lack them, so it must never again be counted in sync with them, nor they with it
    (docs/replication.md, "A set's identity")."""
    left = leave_set(engine)
    if left is None:
        return
    named = f"replica set {left.set_id}" if left.set_id else "its replica set"
    at = f" at position {left.position}" if left.position is not None else ""
    log.warning(
        "this data directory left %s%s: this server runs in single-node mode (no "
        "--replication-lease), whose writes the set's other replicas never get. It is "
        "single-node data now: it may start a new set, and never joins that one again "
        "(its other replicas' directories must be deleted before they join a new set)",
        named,
        at,
        extra={"fields": {"event": "left_set", "set_id": left.set_id}},
    )


def refusal(
    own: str, asked: str, position: Position | None, mine: Position, term: int
) -> dict[str, object] | None:
    """Why the primary of set ``own`` (at ``mine``) will not serve a follower that
    sent set id ``asked`` from ``position`` (None: a snapshot request), as a 409's
    body, or None.

    An empty ``asked`` comes from a version before set ids: not refused for its id,
    but at (0, 0) it is empty or holds single-node data, and neither can follow the
    frames of a primary with a history: it re-copies."""
    if asked and own and asked != own:
        return {"error": OTHER_SET, "set": own, "term": term}
    if not asked and position == (0, 0) and mine != (0, 0):
        return {"error": "too far behind: re-copy", "term": term}
    return None
