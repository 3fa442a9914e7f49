"""Refuse a ready-made answer: a lab file that imports the course's (or torch's) own version of what it asks.

Used by the labs of notebooks 05c and 09 (``estimate``, ``mixed_precision``, ``checkpoint``): the file is read,
not run, and an import of a refused module or name raises :class:`~grader.labs.core.StudentError`, which the
driver reports against every check. (The same idea as ``course.labs.shortcuts`` on the labs branch, kept here
in a dozen lines until the two meet.)
"""

from __future__ import annotations

import ast

from grader.labs.core import StudentError

REFUSED = ("your file uses {name}, a ready-made version of what this lab asks you to write: remove it and write "
           "your {entry} yourself, then run this check again.")


def imported(path: str) -> list[str]:
    """Every module and ``module.name`` the file at ``path`` imports; [] if it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []  # the rank reports a missing file or a syntax error in its own words
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute):  # torch.amp.GradScaler reached through ``import torch``
            names.append(_dotted(node))
    return names


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain (``?`` for a part that is not a plain name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "?")
    return ".".join(reversed(parts))


def refuse(path: str, refused: tuple[str, ...], entry: str) -> None:
    """Raise :class:`StudentError` if the file imports (or names) one of ``refused`` or something inside it."""
    for name in imported(path):
        for prefix in refused:
            if name == prefix or name.startswith(prefix + ".") or name.endswith("." + prefix):
                raise StudentError(REFUSED.format(name=name, entry=entry))
