"""Where a course module or name lives now, for a submission that imports one that does not exist.

A script written against an older course imports ``course.ddp_scripts`` (now ``course.ddp.scripts``) or
``from course.labs.stubs import ...`` (the stubs are files now: ``grader/labs/<lab>/stub.py``). Python says "No
module named 'course.ddp_scripts'", which reads like a missing library. :func:`explain` turns that error's text
into what is missing and where it lives now. The table is derived from the course's own files (:func:`modules`),
never kept by hand: a missing ``course.X`` whose last part (or whose parts joined by ``_``) matches an existing
module is that module. The assignment's grader (:mod:`grader.runner`) and the labs' checker
(:func:`grader.labs.core.describe_error`) both say it.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

COURSE = Path(importlib.util.find_spec("course").origin).parent  # type: ignore[union-attr, arg-type]
#: the lab stubs' old home; each is now a file beside its lab's check
STUBS = "course.labs.stubs"
#: packages a student script never imports (the notebooks' quiz answers): no candidate for a moved module
NOT_IMPORTED = ("course.quiz_answers",)
_NO_MODULE = re.compile(r"No module named '(course(?:\.\w+)*)'")
_NO_NAME = re.compile(r"cannot import name '(\w+)' from '(course(?:\.\w+)*)'")


@cache
def modules() -> tuple[str, ...]:
    """Every module and package of the course, dotted (``course.ddp.scripts``), read from its files."""
    found = []
    for path in sorted(COURSE.rglob("*.py")):
        parts = path.relative_to(COURSE.parent).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if "__pycache__" in parts or dotted.startswith(NOT_IMPORTED):
            continue
        found.append(dotted)
    return tuple(found)


def moved_to(missing: str) -> list[str]:
    """The existing modules that the missing ``course.X...`` most likely became (none, one, or several)."""
    parts = missing.split(".")[1:]
    if not parts:
        return []
    last, joined = parts[-1], "_".join(parts)
    by_last = [m for m in modules() if m != "course" and m.split(".")[-1] == last]
    return by_last or [m for m in modules() if "_".join(m.split(".")[1:]) == joined]


def defined_in(name: str) -> list[str]:
    """The course modules that define ``name`` at top level (a function, class or assignment)."""
    return [module for module in modules() if name in _top_level_names(module)]


def explain(text: str) -> str | None:
    """What a course import in ``text`` (an error's message or traceback) found missing, and where it is now.

    Returns None when ``text`` holds no failed import of a course module or name."""
    modules_missing = _NO_MODULE.findall(text)
    names_missing = _NO_NAME.findall(text)
    if names_missing:
        name, module = names_missing[-1]
        return _missing_name(name, module)
    if modules_missing:
        return _missing_module(modules_missing[-1])
    return None


def _missing_module(missing: str) -> str:
    if missing == STUBS or missing.startswith(STUBS + "."):
        return (f"{missing} does not exist; the lab stubs moved from {STUBS} to files, grader/labs/<lab>/stub.py: "
                "a lab's notebook cell writes yours (labs/<file>.py), so write your code there, import nothing.")
    targets = moved_to(missing)
    if len(targets) == 1:
        return f"{missing} does not exist; it moved to {targets[0]}: import it from there."
    if targets:
        return f"{missing} does not exist; it may have moved to one of {', '.join(targets)}."
    return f"{missing} does not exist, and no course module has that name: check its spelling."


def _missing_name(name: str, module: str) -> str:
    homes = [m for m in defined_in(name) if m != module]
    if len(homes) == 1:
        return f"{module} has no {name}; it lives in {homes[0]} now: import it from there."
    if homes:
        return f"{module} has no {name}; it is defined in {', '.join(homes)}."
    return f"{module} has no {name}, and no course module defines it: check the name's spelling."


@cache
def _top_level_names(module: str) -> frozenset[str]:
    parts = module.split(".")[1:]
    path = COURSE.joinpath(*parts).with_suffix(".py") if parts else COURSE / "__init__.py"
    if not path.is_file():
        path = COURSE.joinpath(*parts, "__init__.py")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return frozenset()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names)
