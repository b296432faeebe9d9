"""A function or method over 70 lines needs a reason, written down in ``LONG_BECAUSE`` below.

TigerBeetle's tidy check, for this code: a function grows one branch at a time
and nobody decides it is too long, so a list that must change when one passes 70
lines makes that a decision, taken in review, with the reason written once. The
list is a ratchet: a listed function that shrinks to 70 lines or fewer (or goes)
fails until its entry goes too, so the list only gets shorter by itself.

Files are not capped: a file is kept whole where it holds one idea. Counted is
what ships and the test kit (``COUNTED``); test modules are scenarios and are
not. A function's length runs from its ``def`` line to its last line (``ast``'s
``end_lineno``), docstring and nested functions included; a nested function or
method is counted on its own as well, named ``Outer.inner``.

The reasons sit in this one list, not in comments on the ``def`` lines: every
exception is read in one place, a review sees the list grow in one diff, and
the product modules carry no notes about a test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNTED = ("server", "operator", "testkit", "observability")  # what ships, and the test kit
LIMIT = 70

# "path::Qualified.name": why it reads best whole.
LONG_BECAUSE: dict[str, str] = {
    "server/stream_server/metrics.py::Metrics.__init__": (
        "the server's metrics declared one after the other, each a name, a help text and "
        "its labels: a table written as code"
    ),
    "server/stream_server/replication/replica_set.py::Replication.__init__": (
        "the replica's parts joined by constructors in the order their references run, "
        "before anything opens or starts: split, that order would be spread over functions"
    ),
    "server/stream_server/engine/log_reads.py::LogReads.read": (
        "the hot loop of every catch-up read, inline per record with no object per record; "
        "a call per record would cost what the loop avoids"
    ),
    "operator/stream_operator/specs/render.py::render_statefulset": (
        "the StatefulSet as one literal object with its volumes and mounts beside it, so the "
        "rendering reads as the manifest it produces"
    ),
    "operator/stream_operator/decisions/scaling.py::plan_scaling": (
        "one decision over the live StatefulSet, pods, claims and Lease: each branch is a "
        "state of a scale to or from one replica, read in the order they occur"
    ),
    "operator/stream_operator/specs/spark_manifests.py::snapshot_objects": (
        "the example manifests of a snapshot-based Spark job, written out as the objects "
        "a user applies"
    ),
    "operator/stream_operator/plugin/report.py::build": (
        "the status report as one literal dictionary, field by field as the plugin prints it"
    ),
    "operator/stream_operator/plugin/cli.py::parser": (
        "the plugin's whole command line, one subcommand after the other, as --help shows it"
    ),
    "testkit/prometheus_operator.py::scrape_configs": (
        "the Prometheus operator's generation of a scrape config, field by field in its order"
    ),
    "testkit/kubelet.py::Kubelet.sync": (
        "one round of the StatefulSet controller's loop, in its order, under one lock"
    ),
    "testkit/kubelet.py::Kubelet._start": (
        "a container's start as a kubelet does it, volumes, env, probes and log, each "
        "step able to leave the pod waiting"
    ),
    "testkit/replicaset.py::ReplicaSet.up": (
        "the start of the API server and each server, all under one try that stops "
        "whatever started when a later part fails"
    ),
    "testkit/replicaset.py::main": (
        "the tool's whole command line, one subcommand after the other, as --help shows it"
    ),
    "testkit/history.py::check": (
        "one pass over a history with every rule beside the others, so a reader checks "
        "that they agree on what an outcome means"
    ),
}


@dataclass(frozen=True)
class Function:
    path: str  # relative to the tree's root, with forward slashes
    name: str  # qualified: Class.method, outer.inner
    line: int
    length: int

    @property
    def key(self) -> str:
        return f"{self.path}::{self.name}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} is {self.length} lines"


def _functions(
    node: ast.AST, prefix: str
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def long_functions(root: Path, tops: Sequence[str] = COUNTED, limit: int = LIMIT) -> list[Function]:
    """Every function or method under ``root/top`` for each of ``tops`` longer than ``limit``."""
    found = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for name, node in _functions(tree, ""):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    rel = path.relative_to(root).as_posix()
                    found.append(Function(rel, name, node.lineno, length))
    return found


def unexplained(found: Sequence[Function], reasons: Mapping[str, str]) -> list[str]:
    """The failures to report: each long function without a reason, named by file, line and length."""
    return [f"{f} (limit {LIMIT})" for f in found if f.key not in reasons]


def stale(found: Sequence[Function], reasons: Mapping[str, str]) -> list[str]:
    """Entries of ``reasons`` that no longer name a long function."""
    return sorted(set(reasons) - {f.key for f in found})


def test_every_function_over_70_lines_has_its_reason() -> None:
    missing = unexplained(long_functions(ROOT), LONG_BECAUSE)
    assert not missing, (
        "over 70 lines with no reason in tests/test_function_lengths.py LONG_BECAUSE:\n  "
        + "\n  ".join(missing)
        + "\nsplit the function, or add it to LONG_BECAUSE with the reason it reads best whole"
    )


def test_every_listed_function_is_still_over_70_lines() -> None:
    gone = stale(long_functions(ROOT), LONG_BECAUSE)
    assert not gone, (
        f"in LONG_BECAUSE but now 70 lines or fewer, renamed or gone: {gone}; "
        "delete its entry in tests/test_function_lengths.py (or rename it, if it moved)"
    )


def test_every_reason_is_a_reason() -> None:
    for key, why in LONG_BECAUSE.items():
        assert len(why.split()) >= 6, f"{key}: say why it reads best whole"


def test_the_check_names_a_long_function_by_file_line_and_length(tmp_path: Path) -> None:
    """The check itself can fail: a 71-line method is reported, a 70-line function is not."""
    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(69))
    (package / "mod.py").write_text(
        "import os\n\n\n"
        f"def short():\n{body}\n"  # def line + 69 lines = 70
        "\n\nclass Thing:\n"
        "    def long(self):\n"
        + "".join(f"        y{i} = {i}\n" for i in range(70))  # def line + 70 lines = 71
    )
    found = long_functions(tmp_path, ("pkg",))
    assert [f.key for f in found] == ["pkg/sub/mod.py::Thing.long"]
    assert unexplained(found, {}) == ["pkg/sub/mod.py:78 Thing.long is 71 lines (limit 70)"]
    assert unexplained(found, {"pkg/sub/mod.py::Thing.long": "a reason"}) == []
    assert stale(found, {"pkg/sub/mod.py::short": "once long"}) == ["pkg/sub/mod.py::short"]
