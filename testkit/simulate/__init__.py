"""A deterministic simulation of a replica set, in the spirit of TigerBeetle's VOPR
and FoundationDB's simulation testing.

The server's own primary, standby and Lease logic (``RoleLoop`` and its Lease
writes with their read-back, ``Shipper``'s commit point, in-sync set and
refusals, ``Freshness`` and the read and write fences, the follower's
decisions, ``replication/rules.py``) runs on an asyncio loop in virtual time
(``clock.py``), against an in-memory Lease (``lease.py``), over lossy,
reordering links (``links.py``), with members that crash and restart with
their simulated storage (``storage.py``, ``members.py``, ``standby.py``).
Clients and faults (``workload.py``) make a history that the history checker
judges (``oracle.py``). One seed is one run (``run.py``): the same seed gives
the same trace. Mutants (``mutants.py``) break one rule each; each must be
caught. ``python -m testkit.simulate --help`` runs it.
"""

from testkit.simulate.run import Result, run_seed

__all__ = ["Result", "run_seed"]
