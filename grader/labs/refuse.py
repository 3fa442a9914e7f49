"""Refuse a lab's ready-made answer: a student's file that imports the course's own version of what it asks.

:func:`refuse_imports` reads the file without running it (every ``import``, ``from ... import``, and every string
naming the module, as ``importlib.import_module("...")`` would) and raises
:class:`~grader.labs.core.StudentError`, whose message the lab prints as it is, for every check.
"""

from __future__ import annotations

import ast

from grader.labs.core import StudentError

REFUSED = ("your file imports {module}, the course's own {what}: this lab asks you to write it yourself. Remove "
           "that import (torch and torch.distributed are fine), then run this check again.")


def imported(path: str, modules: tuple[str, ...]) -> list[str]:
    """The ``modules`` (dotted names) that the file at ``path`` imports or names; [] if none or unreadable."""
    try:
        with open(path) as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):  # the rank's own import reports these in the learner's terms
        return []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return [module for module in modules if any(name == module or name.startswith(module + ".")
                                                or name.startswith(module + ":") for name in names)]


def refuse_imports(path: str, modules: tuple[str, ...], what: str) -> None:
    """Raise StudentError if the file imports one of ``modules``; ``what`` names the answer ("GatherLinear")."""
    found = imported(path, modules)
    if found:
        raise StudentError(REFUSED.format(module=" and ".join(found), what=what))
