"""profile_shares reads py-spy raw stacks, with and without --subprocesses prefixes."""

from __future__ import annotations

from bench.profile_shares import shares

RAW = [
    'process 1:"python -m stream_server";thread (2): MainThread;run (a.py:1);post (h.py:9) 6\n',
    'process 1:"python -m stream_server";thread (2): MainThread;run (a.py:1);get (h.py:5) 2\n',
    'process 1:"python -m stream_server";thread (3): writer;commit (e.py:3) 50\n',
    "thread (4): MainThread;run (a.py:1);post (h.py:9) 2\n",
]


def test_shares_count_one_thread_inclusively():
    total, counts = shares(RAW, "MainThread", None)
    assert total == 10
    assert counts["run (a.py:1)"] == 10 and counts["post (h.py:9)"] == 8
    assert "commit (e.py:3)" not in counts


def test_within_keeps_only_stacks_through_a_frame():
    total, counts = shares(RAW, "MainThread", "get (")
    assert total == 2 and counts["get (h.py:5)"] == 2


def test_functions_count_a_function_once_whatever_its_line():
    raw = [
        "thread (2): MainThread;serve (f.py:10);write (w.py:3) 4\n",
        "thread (2): MainThread;serve (f.py:12) 6\n",
        "thread (2): MainThread;other (o.py:1) 10\n",
    ]
    total, counts = shares(raw, "MainThread", None, functions=True)
    assert total == 20 and counts["serve (f.py)"] == 10 and counts["write (w.py)"] == 4
    assert shares(raw, "MainThread", None)[1]["serve (f.py:12)"] == 6  # by line, as before
