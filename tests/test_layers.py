"""The package's import graph has no cycles, no module is over 500 lines,
and the package root holds exactly the modules docs/architecture.md lists.

Cycles are measured from the source with `ast`, not from what Python happens to import
at run time: every `pytest_evalreplay` import counts, including imports
inside functions and under `TYPE_CHECKING`, because a deferred import is
still a dependency that keeps two modules from being understood (or split)
apart. Run it directly (`python tests/test_layers.py`) to print the graph's
cycles.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = "pytest_evalreplay"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"
MAX_LINES = 500


def module_name(path: Path, root: Path = ROOT) -> str:
    """`pytest_evalreplay/providers/__init__.py` -> `pytest_evalreplay.providers`."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: frozenset[str], root: Path = ROOT) -> Iterator[tuple[str, int]]:
    """Each package module that `path` imports, with the line that imports it.

    `from a import b` names module `a.b` when that is a module, else `a`;
    relative imports are resolved against the importing module's package.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield _known(alias.name, modules), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in modules else _known(base, modules)), node.lineno


def _known(name: str, modules: frozenset[str]) -> str:
    """The longest package module that `name` is or lies in."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Module -> {imported module: first line importing it}, self-imports dropped."""
    paths = sorted(root.rglob("*.py"))
    modules = frozenset(module_name(p, root) for p in paths)
    graph: dict[str, dict[str, int]] = {}
    for path in paths:
        here = module_name(path, root)
        edges = graph.setdefault(here, {})
        for target, line in imported_modules(path, modules, root):
            # A package's __init__ is imported by its submodules' own imports
            # (`from pytest_evalreplay.providers.x import y` runs providers/__init__),
            # but that is Python's loading order, not a dependency the code states.
            if target != here and target != PACKAGE:
                edges.setdefault(target, line)
    return graph


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def source_file(module: str, root: Path = ROOT) -> str:
    """A module's file, relative to the repository (a package's is its __init__.py)."""
    path = root.parent / module.replace(".", "/")
    found = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    return str(found.relative_to(root.parent))


def describe(component: list[str], graph: Mapping[str, Mapping[str, int]], root: Path = ROOT) -> str:
    """The edges inside one cycle, each with the file and line of its import."""
    members = set(component)
    lines = [f"cycle through {', '.join(component)}:"]
    for src in component:
        for dst, line in sorted(graph[src].items()):
            if dst in members:
                lines.append(f"  {source_file(src, root)}:{line} imports {dst}")
    return "\n".join(lines)


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in the package:\n" + "\n".join(describe(c, graph) for c in found)


# Providers run without pytest (EvalTask.evaluate, a user's own script) and
# sit below everything but the data model: they read the resolved settings,
# the request/generation types, the saved-run readers (replay) and the
# fingerprint of a path, the credentials hidden from messages; nothing of the
# session or the pytest-facing layer.
PROVIDER_MAY_IMPORT = ("settings", "model", "values", "storage", "formats", "providers")
PYTEST_FREE = ("settings.py", "model.py", "task.py", "values", "providers", "formats")


def test_providers_import_only_lower_layers() -> None:
    graph = import_graph()
    allowed = tuple(f"{PACKAGE}.{name}" for name in PROVIDER_MAY_IMPORT)
    wrong = [
        f"{src} imports {dst} ({src.replace('.', '/')}:{line})"
        for src, edges in graph.items()
        if src.startswith(f"{PACKAGE}.providers")
        for dst, line in edges.items()
        if not any(dst == a or dst.startswith(a + ".") for a in allowed)
    ]
    assert not wrong, "\n".join(wrong)


def absolute_imports(path: Path) -> Iterator[tuple[str, int]]:
    """Every absolute module name `path` imports, with its line."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module, node.lineno


def test_settings_model_providers_and_formats_do_not_import_pytest() -> None:
    wrong = []
    for name in PYTEST_FREE:
        target = ROOT / name
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            wrong += [
                f"{path}:{line} imports {module}"
                for module, line in absolute_imports(path)
                if module.split(".")[0] in ("pytest", "_pytest")
            ]
    assert not wrong, "\n".join(wrong)


def test_graph_sees_deferred_imports(tmp_path: Path) -> None:
    """Imports inside functions and under TYPE_CHECKING are edges too."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pytest_evalreplay import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_evalreplay.a import f\n"
    )
    graph = import_graph(pkg)
    assert graph[f"{PACKAGE}.a"] == {f"{PACKAGE}.b": 2}
    assert graph[f"{PACKAGE}.b"] == {f"{PACKAGE}.a": 3}
    assert cycles(graph) == [[f"{PACKAGE}.a", f"{PACKAGE}.b"]]
    assert f"{PACKAGE}/b.py:3 imports {PACKAGE}.a" in describe(cycles(graph)[0], graph, pkg)


def test_graph_sees_a_package_and_its_submodules(tmp_path: Path) -> None:
    """A package's __init__ that imports a submodule importing the package is a cycle;
    a submodule importing a sibling through the package is not."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("def load():\n    from pytest_evalreplay.sub import reader\n")
    (pkg / "sub" / "reader.py").write_text("from pytest_evalreplay.sub import load\n")
    (pkg / "sub" / "other.py").write_text("from pytest_evalreplay.sub.shared import x\n")
    (pkg / "sub" / "shared.py").write_text("x = 1\n")
    graph = import_graph(pkg)
    assert graph[f"{PACKAGE}.sub.other"] == {f"{PACKAGE}.sub.shared": 1}
    assert cycles(graph) == [[f"{PACKAGE}.sub", f"{PACKAGE}.sub.reader"]]


def long_modules(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """Each module over `limit` lines, with its length."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_module_over_500_lines() -> None:
    long = long_modules()
    assert not long, f"over {MAX_LINES} lines (a module with two jobs: split it):\n" + "\n".join(long)


def test_long_modules_counts_lines(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "short.py").write_text("x = 1\n" * 3)
    (pkg / "sub" / "long.py").write_text("x = 1\n" * 4)
    assert long_modules(pkg, limit=3) == [f"{PACKAGE}/sub/long.py: 4 lines"]


def documented_modules(doc: str) -> list[str]:
    """The modules of the "Who owns what" table's first column, as paths in
    the package (`run/session.py`), in the order the table names them."""
    section = doc.split("\n## Who owns what\n", 1)[1].split("\n## ", 1)[0]
    return [
        name
        for line in section.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([^`]+\.py)`", line.split("|")[1])
    ]


def test_the_package_root_holds_only_the_modules_architecture_lists() -> None:
    listed = documented_modules(ARCHITECTURE.read_text(encoding="utf-8"))
    doc = ARCHITECTURE.relative_to(ROOT.parent)
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert not twice, f"{doc} lists these modules more than once in 'Who owns what': {twice}"
    stale = [name for name in listed if not (ROOT / name).is_file()]
    assert not stale, f"{doc} lists modules that do not exist (update its 'Who owns what'): {stale}"
    root = sorted(path.name for path in ROOT.glob("*.py"))
    unlisted = [name for name in root if name not in listed]
    assert not unlisted, (
        f"{PACKAGE}/ holds modules {doc} does not list: {unlisted}; "
        "move each into the subpackage of its role, or add it to the doc's layers and 'Who owns what'"
    )


def test_documented_modules_reads_the_first_column() -> None:
    doc = (
        "# A\n\n## Who owns what\n\n| module | owns |\n|---|---|\n"
        "| `a.py`, `sub/b.py` | the `c.py` of it |\n\n## Next\n\n| `d.py` | x |\n"
    )
    assert documented_modules(doc) == ["a.py", "sub/b.py"]


if __name__ == "__main__":
    graph = import_graph()
    for component in cycles(graph):
        print(describe(component, graph))
