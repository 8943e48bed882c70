"""The layout issue 40 set, held: no Python file over 450 lines, and no
import cycle among tensile_tf's modules (imports inside functions count: a
lazy import is still a dependency a reader must follow; imports under ``if
TYPE_CHECKING:`` do not: they name a type for annotations and never run).
Pure: read as text."""
import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

MAX_LINES = 450


def _python_files():
    for top in ("tensile_tf", "tf_plugin", "benchmarks", "tests"):
        yield from sorted((REPO_ROOT / top).rglob("*.py"))


def test_no_python_file_is_over_450_lines():
    long = {str(p.relative_to(REPO_ROOT)): n for p in _python_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_imports(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (at any depth of the file)."""
    modules = {}
    for p in sorted((root / package).rglob("*.py")):
        rel = p.relative_to(root).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = p
    graph = {}
    for name, p in modules.items():
        deps = set()
        tree = ast.parse(p.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                # `from pkg import submodule` depends on the submodule; importing pkg's __init__ first is
                # what importing any module of pkg does, not a dependency. Any other name from a package
                # (an ancestor's included: issue 57) is a dependency on its __init__.
                targets = subs if all(x in modules for x in subs) else [node.module] + subs
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_the_package():
    graph = module_imports(REPO_ROOT, "tensile_tf")
    assert len(graph) > 50 and graph["tensile_tf.cli"]   # the check reads the package at all
    assert cycles(graph) == []


def test_the_cycle_check_itself_can_fail(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    assert cycles(module_imports(tmp_path, "pkg")) == [["pkg.a", "pkg.b"]]
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert cycles(module_imports(tmp_path, "pkg")) == []   # an annotation's import never runs
    # an ancestor package's name is a dependency (issue 57: two cycles hid behind it); its submodules are not
    (pkg / "__init__.py").write_text("def f():\n    from pkg import b\n    return b.g\n")
    (pkg / "b.py").write_text("import pkg\n")
    assert cycles(module_imports(tmp_path, "pkg")) == [["pkg", "pkg.b"]]
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text("from pkg import a\n")     # the submodule a, not pkg's __init__
    assert cycles(module_imports(tmp_path, "pkg")) == []
