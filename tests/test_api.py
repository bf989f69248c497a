"""docs/api.md is the public API: every name and path it lists imports, the
top-level names are exactly `__all__`, and every moved path it lists still
imports the new module with a DeprecationWarning naming where it went."""

from __future__ import annotations

import importlib
import itertools
import re
import sys
import warnings
from pathlib import Path

import pytest

import pytest_evalreplay

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def table_rows(doc: str, heading: str) -> list[list[str]]:
    """The cells of each body row of the first table under `heading`."""
    section = doc.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _doc() -> str:
    return API.read_text(encoding="utf-8")


TOP_LEVEL = "`from pytest_evalreplay import ...`"
STABLE = [(ticked(row[0])[0], ticked(row[2])) for row in table_rows(_doc(), "Stable module paths")]
MOVED = [(ticked(row[0])[0], ticked(row[1])[0]) for row in table_rows(_doc(), "Moved module paths")]


def test_the_top_level_names_are_all_of_all_and_import() -> None:
    listed = [name for row in table_rows(_doc(), TOP_LEVEL) for name in ticked(row[0])]
    assert sorted(listed) == sorted(pytest_evalreplay.__all__), f"{API.name} and __all__ differ"
    for name in listed:
        assert getattr(pytest_evalreplay, name) is not None


def test_the_doc_lists_stable_and_moved_paths() -> None:
    """The parsing found the tables (an empty parametrization would test nothing)."""
    assert len(STABLE) >= 10
    assert all(names for _, names in STABLE)
    assert dict(MOVED) == pytest_evalreplay._MOVED


@pytest.mark.parametrize(("module", "names"), STABLE, ids=[m for m, _ in STABLE])
def test_a_stable_path_imports_with_its_names(module: str, names: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"{API.name} says {module} has {missing}"


def _forget(monkeypatch: pytest.MonkeyPatch, old: str) -> None:
    """Import `old` afresh in this test, and leave the package as it was after it."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.setattr(pytest_evalreplay, old.rpartition(".")[2], None, raising=False)


@pytest.mark.parametrize(("old", "new"), MOVED, ids=[old for old, _ in MOVED])
def test_a_moved_path_imports_the_new_module_and_warns(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    _forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} moved to {re.escape(new)}"):
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert sys.modules[old] is moved


@pytest.mark.parametrize(("old", "new"), MOVED, ids=[old for old, _ in MOVED])
def test_a_moved_path_under_warnings_as_errors_names_the_new_one(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    _forget(monkeypatch, old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(DeprecationWarning, match=re.escape(new)):
            importlib.import_module(old)


def test_an_unknown_old_path_is_not_made_up() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("pytest_evalreplay.no_such_module")


def test_table_rows_reads_the_first_table_under_its_heading() -> None:
    doc = (
        "# A\n\n## One\n\ntext\n\n| a | b |\n|---|---|\n| `x` | `y`, `z` |\n\n| d |\n|---|\n| `v` |\n"
        "\n## Two\n\n| c |\n|---|\n| `w` |\n"
    )
    assert table_rows(doc, "One") == [["`x`", "`y`, `z`"]]
    assert ticked(table_rows(doc, "One")[0][1]) == ["y", "z"]
