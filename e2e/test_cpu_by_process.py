"""cpu_by_process follows a command's whole process tree and names each kind of process."""

from __future__ import annotations

from cpu_by_process import descendants, kind

TABLE = {
    10: (1.0, "python -m pytest -q", 1),
    11: (2.0, "python -m stream_server serve --port 1", 10),
    12: (0.5, "python -m testkit.kube_serve --url-file f", 10),
    13: (0.1, "podman run x", 11),  # a grandchild
    20: (9.0, "python -m stream_server serve --port 2", 1),  # not the command's
}


def test_the_tree_below_the_command_and_nothing_beside_it():
    assert descendants(10, TABLE) == {10, 11, 12, 13}


def test_kinds_by_what_the_command_line_holds_and_an_exited_process_named_so():
    assert [kind(TABLE[pid][1]) for pid in (10, 11, 12, 13)] == [
        "pytest",
        "stream_server",
        "testkit.kube_serve",
        "podman",
    ]
    assert kind("") == "(exited)"
