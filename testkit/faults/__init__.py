"""Fault injection for replica sets of real server processes, in the spirit of Jepsen,
for the fault tests (``tests/replication/test_faults_*.py``). One idea per module:

- ``processes``: pauses longer than the lease (SIGSTOP/SIGCONT), kill -9 of any subset;
- ``net``: partitions: each server in a network namespace of its own on a bridge,
  two-way and one-way cuts with iptables inside a namespace, heal;
- ``proxy``: a TCP proxy in front of the emulated API server that loses the answer
  of a chosen request after the write happened, or cuts a server off the API;
- ``clock``: a slow clock for one server process (libfaketime, monotonic included);
- ``disk``: a small real filesystem as a server's data directory, filled up.

``ReplicaSet.up(launch=...)`` starts a server inside a namespace, under a slow
clock, or pointed at its own API proxy. The checks the tests make of a run's
history are in ``testkit.history``.
"""
