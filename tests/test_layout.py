"""The code's shape: no module imports itself back, directly or through others, and none is long.

The graph is read from the source with `ast`, nothing imported: every `.py` under src/hotrod and
benchmarks/, and every import in it, those inside functions too (they run, only later), but not those
under `if TYPE_CHECKING:` (they never run). Importing `hotrod.x.y` imports the packages on the way
(`hotrod/x/__init__.py`), except the importer's own packages, which are already under way when it runs;
`from hotrod.x import y` is an import of the submodule `hotrod.x.y` where there is one, of `hotrod.x`
otherwise. The benchmark scripts import one another by bare name (`from serve_load import ...`), the
directory they run from being on the path.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "hotrod"
SCRIPTS = ROOT / "benchmarks"


def modules() -> dict[str, Path]:
    """Every module by its dotted name (a package by its own: `hotrod.runtime` is its __init__.py); a
    benchmark script is `benchmarks.<name>`."""
    found = {}
    for base, top in ((PACKAGE.parent, PACKAGE), (ROOT, SCRIPTS)):
        for path in sorted(top.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that can run: everywhere in the tree but the body of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules that module `name` (at `path`) imports, among `known`."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    script = name.startswith("benchmarks.")
    edges: set[str] = set()

    def add(target: str) -> None:
        """`target`, and the packages above it that `name` is not inside."""
        if script and f"benchmarks.{target}" in known:  # a script importing a sibling by bare name
            target = f"benchmarks.{target}"
        while target and target not in known:  # `import a.b.c` where c is a name, not a module
            target = target.rpartition(".")[0]
        parts = target.split(".") if target else []
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            ancestor = name == prefix or name.startswith(prefix + ".")
            if prefix in known and (end == len(parts) or not ancestor):
                edges.add(prefix)

    for node in import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):  # `import hotrod` in a hotrod module still runs hotrod/__init__.py
            for alias in node.names:
                add(alias.name)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        if script and f"benchmarks.{base}" in known:
            base = f"benchmarks.{base}"
        for alias in node.names:  # a submodule where there is one, else a name of `base`'s own
            submodule = f"{base}.{alias.name}"
            add(submodule if submodule in known else base)
    edges.discard(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module: each a set of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest way from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    return [start]


def cycles_report(graph: dict[str, set[str]]) -> list[str]:
    return [f"{len(c)} modules: {', '.join(c)}\n    e.g. {' -> '.join(a_cycle(graph, c))}"
            for c in strongly_connected(graph)]


def test_the_checker_sees_imports_inside_functions_but_not_type_checking_blocks(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    source = tmp_path / "pkg" / "a.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                      "def f():\n    from pkg.b import thing\n")
    known = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": source, "pkg.b": source, "pkg.c": source,
             "benchmarks.a": source, "benchmarks.b": source}
    assert imported("pkg.a", source, known) == {"pkg.b"}
    source.write_text("import os\nfrom . import c\nfrom pkg import name\n")  # `name` is the package's own
    assert imported("pkg.a", source, known) == {"pkg", "pkg.c"}
    source.write_text("from b import run\nimport pkg.c\n")  # a script's sibling by bare name; a package on the way
    assert imported("benchmarks.a", source, known) == {"benchmarks.b", "pkg", "pkg.c"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    graph = import_graph()
    assert "hotrod.runtime.static" in graph and "benchmarks.serve_load" in graph
    assert not strongly_connected(graph), "modules that import each other:\n" + "\n".join(cycles_report(graph))


LONGEST = 400  # lines a module of the package may have: past it, it holds more than one thing


def test_every_module_is_short():
    long = {str(path.relative_to(ROOT)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST}
    assert not long, f"modules over {LONGEST} lines: {long}"


# Where a task's, a kind's or a precision's name may be compared: their registries, and the peers' workers,
# which run in environments of their own and map hotrod's names to their tools' formats.
REGISTRIES = ("tasks", "kinds.py", "precisions.py", "registry.py", "bench/workers", "bench/openvino_peer.py",
              "bench/llamacpp.py", "bench/floor.py")


def _names_compared(tree: ast.AST, names: set[str]) -> Iterator[tuple[int, str]]:
    """(line, name) of every comparison of a value with a registered name (or a tuple/list/set of them)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            for item in items:
                if isinstance(item, ast.Constant) and item.value in names:
                    yield node.lineno, item.value


def test_names_are_compared_only_in_their_registries():
    from hotrod import kinds, precisions, tasks

    names = {*tasks.names(lambda spec: True), *kinds.KINDS, *precisions.names()}
    found = [f"{path.relative_to(PACKAGE)}:{line} compares {name!r}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if not str(path.relative_to(PACKAGE)).startswith(REGISTRIES)
             for line, name in _names_compared(ast.parse(path.read_text(encoding="utf-8")), names)]
    assert not found, "\n".join(found)
