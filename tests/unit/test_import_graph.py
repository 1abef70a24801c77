"""The project's modules import one another without cycles, and none grows past 450 lines.

The graph counts every import a module contains: at the top, under ``if TYPE_CHECKING:``, inside
functions, absolute and relative. ``from package import name`` is an edge to ``package.name``
when that is a module and to the package's ``__init__`` otherwise; importing ``a.b`` is an edge
to ``a.b`` only (the parent package runs first, but it is not what the importer depends on).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MAX_LINES = 450


def package_dirs() -> list[Path]:
    return [*sorted(ROOT.glob("libs/pipeline*/")), *sorted(ROOT.glob("services/*/pipeline_*"))]


def module_files(dirs: Iterable[Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the given package dirs."""
    modules: dict[str, Path] = {}
    for top in dirs:
        for path in sorted(top.rglob("*.py")):
            parts = list(path.relative_to(top.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The project modules ``name`` (in ``path``) imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in modules else origin)
    return {target for target in found if target in modules and target != name}


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def project_graph() -> dict[str, set[str]]:
    """The import graph of the project's packages."""
    modules = module_files(package_dirs())
    assert "pipeline_worker" in modules  # the walk found the packages
    assert "pipeline._app" in modules
    return import_graph(modules)


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None (iterative DFS)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = [start]
        on_path = {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if following in on_path:
                return [*path[path.index(following) :], following]
            if following in done:
                continue
            path.append(following)
            on_path.add(following)
            stack.append(iter(sorted(graph[following])))
    return None


def test_the_project_has_no_import_cycle() -> None:
    cycle = find_cycle(project_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_is_over_the_line_limit() -> None:
    too_long = []
    for path in module_files(package_dirs()).values():
        relative = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            too_long.append(f"{relative}: {lines} lines")
    assert not too_long, f"split these by concept (limit {MAX_LINES}): {too_long}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": set(), "c": {"c2"}, "c2": {"c"}}) == [
        "c",
        "c2",
        "c",
    ]


def test_type_checking_and_relative_imports_count(tmp_path: Path) -> None:
    top = tmp_path / "pkg"
    (top / "sub").mkdir(parents=True)
    (top / "__init__.py").write_text("from .sub import thing\n")
    (top / "sub" / "__init__.py").write_text("thing = 1\n")
    (top / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..b import B\n"
    )
    (top / "b.py").write_text("def f() -> None:\n    from .sub import a\n")
    modules = module_files([top])
    graph = import_graph(modules)
    assert graph == {
        "pkg": {"pkg.sub"},
        "pkg.sub": set(),
        "pkg.sub.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.a"},
    }
    assert find_cycle(graph) == ["pkg.b", "pkg.sub.a", "pkg.b"]
