"""Refuse a lab's shortcut: a student's file that uses the course's (or torch's) own version of what the lab asks.

A :class:`~grader.labs.core.Lab` names its shortcuts as ``"module:name"`` (``"course.model_parallel.schedules:
one_f_one_b"``). Two guards refuse them. :func:`uses` reads the student's file without running it (every import,
and every dotted name that resolves through an import to a shortcut); :func:`guarded` replaces each shortcut,
inside a rank, by a twin that raises :class:`Refused` when it is called from the student's file (an import the
reader missed: ``importlib``, ``getattr``). The checker's own calls to the same functions are let through.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

REFUSED = ("your file uses {name}, a ready-made version of what this lab asks you to write: remove it and "
           "write your {entry} yourself, then run this check again.")


class Refused(Exception):
    """The student's code used a shortcut the lab forbids; the message says which, in the learner's terms."""


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` with ``a`` resolved through the file's imports, or None if ``node`` is no dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def uses(path: str, shortcuts: tuple[str, ...]) -> list[str]:
    """The shortcuts (as ``module.name``) that the file at ``path`` imports or names; [] if none or unreadable."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []  # the rank reports a missing file or a syntax error in its own words
    wanted = {shortcut.replace(":", ".") for shortcut in shortcuts}
    aliases: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # a module import is fine: only the use of its shortcut counts
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = full
                found += [full] if full in wanted else []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = _dotted(node, aliases)
            found += [name] if name in wanted else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [node.value] if node.value in wanted else []
    return list(dict.fromkeys(found))


def _from_student(path: str) -> bool:
    """True if the student's file is on the current call stack."""
    target = os.path.abspath(path)
    frame = sys._getframe(2)
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename) == target:
            return True
        frame = frame.f_back
    return False


def _refusing(original: Callable[..., Any], message: str, path: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        if _from_student(path):
            raise Refused(message)
        return original(*args, **kwargs)
    return refusing


@contextmanager
def guarded(path: str, shortcuts: tuple[str, ...], message: Callable[[str], str]) -> Iterator[None]:
    """While open, calling (or building) a shortcut from the student's file at ``path`` raises :class:`Refused`.

    Functions are replaced in their module, classes get a refusing ``__init__``; everything comes back on exit.
    ``message(name)`` is the refusal for the shortcut ``name`` (``module.name``).
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for shortcut in shortcuts:
            module_name, _, name = shortcut.partition(":")
            module = importlib.import_module(module_name)
            original = getattr(module, name)
            text = message(f"{module_name}.{name}")
            if inspect.isclass(original):
                saved.append((original, "__init__", original.__dict__.get("__init__")))
                original.__init__ = _refusing(original.__init__, text, path)
            else:
                saved.append((module, name, original))
                setattr(module, name, _refusing(original, text, path))
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
