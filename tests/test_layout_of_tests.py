"""No test module imports another test module or a conftest.py: what tests share lives in
``testkit`` (or is a fixture in the directory's conftest.py, which pytest hands out).

A test module imported by another is imported twice (once by pytest under its
own name, once by the importer under another), so its module-level state and
its tests exist twice; a helper kept in a test module is hidden where nobody
looks for one; and an import of ``conftest`` depends on which conftest.py
pytest put on ``sys.path`` first. Tests are not a package here, so
import-linter cannot say this: the check reads every module's imports with
``ast`` and resolves each name the ways Python could find it when pytest runs
(``tests.x.y`` from the root, a bare name from any test directory pytest puts
on ``sys.path``, relative names from the module's package).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("tests", "e2e")


def is_test_module(path: Path) -> bool:
    """pytest's test modules (its default ``python_files``) and its conftest files."""
    name = path.name
    return name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py")


def base_dir(path: Path) -> Path:
    """The directory pytest (``--import-mode=prepend``) puts on ``sys.path`` for ``path``:
    the first one up that is not a package."""
    here = path.parent
    while (here / "__init__.py").exists():
        here = here.parent
    return here


def module_files(dotted: str, bases: list[Path]) -> Iterator[Path]:
    """The files the module ``dotted`` could be found in, from each of ``bases``."""
    parts = dotted.lstrip(".").split(".")
    for base in bases:
        for candidate in (
            base.joinpath(*parts).with_suffix(".py"),
            base.joinpath(*parts, "__init__.py"),
        ):
            if candidate.is_file():
                yield candidate


def imported_names(path: Path, tree: ast.Module) -> Iterator[tuple[str, list[Path]]]:
    """Each module name ``path`` imports (``from m import n`` names both ``m`` and ``m.n``),
    with the directories to look for it in: a relative import's package, else the roots."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = path.parents[node.level - 1]
                names = [node.module] if node.module else []
                names += [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
                for name in names:
                    yield "." * node.level + name, [package]
            else:
                assert node.module is not None
                yield node.module, []
                for alias in node.names:
                    yield f"{node.module}.{alias.name}", []


def crossings(root: Path) -> list[str]:
    """Every import, in the test trees under ``root``, of a test module or a conftest."""
    files = sorted(p for tree in TREES for p in (root / tree).rglob("*.py"))
    # A whole run puts every test directory on sys.path, so a bare name can reach any of them.
    roots = [root, *sorted({base_dir(p) for p in files})]
    found = []
    for path in files:
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for name, bases in imported_names(path, tree):
            for target in module_files(name, bases or roots):
                if is_test_module(target) and target != path:
                    found.append(
                        f"{path.relative_to(root)} imports {name} ({target.relative_to(root)})"
                    )
    return sorted(set(found))


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    found = crossings(ROOT)
    assert not found, "test modules that import a test module or a conftest:\n" + "\n".join(found)


def test_the_check_sees_every_way_of_importing_one(tmp_path: Path) -> None:
    """Absolute, bare (from another test directory too), relative, and conftest imports."""
    (tmp_path / "conftest.py").write_text("")
    engine = tmp_path / "tests" / "engine"
    engine.mkdir(parents=True)
    (engine / "test_engine.py").write_text("")
    (engine / "helpers.py").write_text("import conftest\n")
    (engine / "test_absolute.py").write_text("from tests.engine.test_engine import crash\n")
    (engine / "test_bare.py").write_text("def f():\n    import test_engine\n")
    (engine / "test_fine.py").write_text("from helpers import x\nimport os\n")
    package = tmp_path / "tests" / "images"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "conftest.py").write_text("")
    (package / "test_relative.py").write_text("from .conftest import UID\nfrom . import conftest\n")
    (package / "test_across.py").write_text("from test_engine import crash\n")
    e2e = tmp_path / "e2e"
    e2e.mkdir()
    (e2e / "test_e2e.py").write_text("from tests.images import conftest\n")
    assert crossings(tmp_path) == [
        "e2e/test_e2e.py imports tests.images.conftest (tests/images/conftest.py)",
        "tests/engine/helpers.py imports conftest (conftest.py)",
        "tests/engine/test_absolute.py imports tests.engine.test_engine (tests/engine/test_engine.py)",
        "tests/engine/test_bare.py imports test_engine (tests/engine/test_engine.py)",
        "tests/images/test_across.py imports test_engine (tests/engine/test_engine.py)",
        "tests/images/test_relative.py imports .conftest (tests/images/conftest.py)",
    ]
