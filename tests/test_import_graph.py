"""The import graph of course/ and grader/: no circle, lessons do not import the labs, the course not the grader.

Read from the source (every ``import`` statement, in functions too, except under ``if TYPE_CHECKING:``), so a
circle hidden behind a deferred import counts: it still means two modules that cannot be read one without the
other. An edge goes to the module named (``from a.b import c`` to ``a.b.c`` if that is a module, else ``a.b``), and to
the packages above it (``a``, ``a.b``), whose ``__init__`` runs first: a circle through a package's ``__init__``
counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("course", "grader")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the packages (a package is its ``__init__.py``)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        children = list(ast.iter_child_nodes(node))
        if _type_checking_only(node):
            children = list(node.orelse)  # type: ignore[attr-defined]
        stack.extend(children)
    return found


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package modules that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            while target and target not in modules:  # import a.b.c where only a.b is ours: the nearest module
                target = target.rpartition(".")[0]
            edges.update(_with_parents(target, name, modules))
    return edges


def _with_parents(target: str, name: str, modules: set[str]) -> set[str]:
    """``target`` and the packages above it, whose ``__init__`` importing it runs first (``a.b.c``: ``a``, ``a.b``),
    less ``name`` and the packages above ``name``: those run before ``name`` does, whatever it imports."""
    own = {".".join(name.split(".")[:n]) for n in range(1, name.count(".") + 2)}
    parts = target.split(".") if target else []
    found = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return {module for module in found if module in modules and module not in own}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    files = module_files(root)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as ``[a, b, ..., a]``, or None if it has none (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for following in sorted(graph.get(node, ())):
            if state.get(following) == 1:
                return path[path.index(following):] + [following]
            if following not in state and (cycle := visit(following)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_course_and_grader_import_no_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


def test_no_lesson_imports_the_labs():
    lessons = {name: edges for name, edges in import_graph().items()
               if name.startswith("course.") and not name.startswith("course.labs")}
    wrong = {name: sorted(edge for edge in edges if edge.startswith(("course.labs", "grader.labs")))
             for name, edges in lessons.items()}
    assert not {name: edges for name, edges in wrong.items() if edges}


def test_the_course_imports_the_grader_only_for_the_notebooks_lab_check():
    graph = import_graph()
    wrong = {name: sorted(edge for edge in edges if edge.startswith("grader")) for name, edges in graph.items()
             if name.startswith("course") and name != "course.labs"}
    assert not {name: edges for name, edges in wrong.items() if edges}
    assert graph["course.labs"] == {"grader", "grader.labs"}  # grader's __init__ runs first


@pytest.mark.parametrize("deferred", [False, True])
def test_a_circle_is_found_even_behind_a_deferred_import(tmp_path, deferred):
    (tmp_path / "course").mkdir()
    (tmp_path / "grader").mkdir()
    (tmp_path / "course" / "__init__.py").write_text("")
    (tmp_path / "grader" / "__init__.py").write_text("")
    (tmp_path / "course" / "a.py").write_text("from course.b import f\n")
    body = "def g():\n    from course import a\n" if deferred else "import course.a\n"
    (tmp_path / "course" / "b.py").write_text(body + "def f():\n    pass\n")
    (tmp_path / "grader" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                             "    from grader import d\n")
    (tmp_path / "grader" / "d.py").write_text("from grader import c\n")
    assert find_cycle(import_graph(tmp_path)) == ["course.a", "course.b", "course.a"]


def test_a_circle_through_a_parent_packages_init_is_found(tmp_path):
    for package in ("course", "course/p", "grader"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "course" / "p" / "__init__.py").write_text("from course import a\n")  # p's init needs a
    (tmp_path / "course" / "p" / "q.py").write_text("")
    (tmp_path / "course" / "a.py").write_text("import course.p.q\n")  # importing p.q runs p's __init__ first
    assert find_cycle(import_graph(tmp_path)) == ["course.a", "course.p", "course.a"]
    (tmp_path / "course" / "p" / "__init__.py").write_text("from course.p import q\n")  # its own child: no circle
    assert find_cycle(import_graph(tmp_path)) is None
