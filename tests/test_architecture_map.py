"""docs/architecture.md's map of the code names every package folder, and only folders that exist.

A map written once goes stale as folders come and go (it once left out
``subscriptions/`` and ``config/``); checked against the tree, a new package
fails this test until it has its line. The map is the first fenced block under
"## The map of the code"; in it, a line whose first word ends in ``/`` and is
followed by two spaces (the gap before its description) or nothing names a
folder, nested under the nearest line above it that is indented less (the top
level gives paths from the repository's root). Other sections of the page,
including any about one package, are not read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = (
    "server/stream_server",
    "server/stream_format",
    "server/stream_spark",
    "operator/stream_operator",
    "testkit",
)
HEADING = "## The map of the code"
FOLDER = re.compile(r"^( *)([\w.-]+(?:/[\w.-]+)*/)(?:  |$)")


def map_block(page: str) -> list[str]:
    """The lines of the first fenced block after ``HEADING``."""
    _, found, after = page.partition(HEADING)
    assert found, f"no {HEADING!r} section"
    fence = after.index("```")
    body = after[after.index("\n", fence) + 1 :]
    return body[: body.index("```")].splitlines()


def mapped_folders(lines: Sequence[str]) -> dict[str, int]:
    """Each folder the map names, as a path from the root, with its line in the block (from 1)."""
    folders: dict[str, int] = {}
    parents: list[tuple[int, str]] = []  # (indent, path) of the enclosing entries
    for number, line in enumerate(lines, 1):
        entry = FOLDER.match(line)
        if not entry:
            continue
        indent = len(entry.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = "/".join(p for p in (parents[-1][1] if parents else "", entry.group(2)) if p)
        path = path.rstrip("/")
        folders[path] = number
        parents.append((indent, path))
    return folders


def package_folders(root: Path, tops: Sequence[str] = MAPPED) -> set[str]:
    """Each top and every folder below it holding a Python module, as paths from ``root``."""
    found = set()
    for top in tops:
        found.add(top)
        for module in (root / top).rglob("*.py"):
            folder = module.parent
            while folder != root / top:
                found.add(folder.relative_to(root).as_posix())
                folder = folder.parent
    return {f for f in found if "__pycache__" not in f.split("/")}


def disagreements(root: Path, page: str, tops: Sequence[str] = MAPPED) -> list[str]:
    """What is wrong with the map: folders it leaves out, and folders it names that do not exist."""
    named = mapped_folders(map_block(page))
    missing = sorted(package_folders(root, tops) - set(named))
    absent = sorted(p for p in named if not (root / p).is_dir())
    return [f"not in the map: {p}/" for p in missing] + [
        f"in the map (line {named[p]} of the block) but not a folder: {p}/" for p in absent
    ]


def test_the_map_names_every_package_folder_and_nothing_else() -> None:
    wrong = disagreements(ROOT, (ROOT / "docs" / "architecture.md").read_text())
    assert not wrong, (
        "docs/architecture.md's map of the code is out of step with the tree:\n  "
        + "\n  ".join(wrong)
        + "\ngive each package folder its line (nested under its parent), drop gone ones"
    )


def test_the_check_fails_on_a_missing_and_on_a_made_up_folder(tmp_path: Path) -> None:
    for module in ("pkg/a.py", "pkg/sub/b.py", "pkg/sub/deep/c.py", "pkg/data/x.txt"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    page = (
        "# Title\n\n```\nnot/ the map\n```\n\n"
        f"{HEADING}\n\n```\n"
        "pkg/          the package\n"
        "  a.py        a module\n"
        "  sub/        a subpackage\n"
        "                continued/ text, one space after it: a description\n"
        "  gone/       was here once\n"
        "```\n\n## pkg/sub/deep\n\n```\npkg/sub/deep/   another section's block\n```\n"
    )
    assert mapped_folders(map_block(page)) == {
        "pkg": 1,
        "pkg/sub": 3,
        "pkg/gone": 5,
    }
    assert disagreements(tmp_path, page, ("pkg",)) == [
        "not in the map: pkg/sub/deep/",
        "in the map (line 5 of the block) but not a folder: pkg/gone/",
    ]
