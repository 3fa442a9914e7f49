"""Load a student's lab file inside a rank and turn what it raises into a sentence in the learner's terms.

Used by the labs' in-rank checks (``course.labs.ddp``, ``course.labs.zero``): :func:`load` imports the file
by path (a fresh module each time) and returns the class or function the lab asks for; inside
:func:`blame`, an exception from the student's code becomes :class:`StudentError` whose message names the
entry, the rank, the error and the line of the student's file ("your MyDDP raised NotImplementedError on rank 0:
write MyDDP (line 31 of ddp_by_hand.py)"), never the checker's traceback.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_loaded = itertools.count()


class StudentError(Exception):
    """The student's code raised, or the file lacks what the lab asks for; ``str()`` is the learner's message."""


def load(path: str, entry: str) -> Any:
    """Import the file at ``path`` as a new module and return its ``entry``.

    Raises:
        StudentError: the file is missing, raises on import, or defines no ``entry``.
    """
    if not os.path.isfile(path):
        raise StudentError(f"there is no file {path}: run the %%writefile cell that creates it first")
    spec = importlib.util.spec_from_file_location(f"lab_submission_{next(_loaded)}", path)
    module = importlib.util.module_from_spec(spec)
    with blame("importing your file", path):
        spec.loader.exec_module(module)
    if not hasattr(module, entry):
        raise StudentError(f"{os.path.basename(path)} defines no {entry}: the lab calls {entry}, keep that name")
    return getattr(module, entry)


@contextmanager
def blame(what: str, path: str, rank: int | None = None) -> Iterator[None]:
    """Turn any exception raised meanwhile into :class:`StudentError` naming ``what`` raised it and where."""
    try:
        yield
    except StudentError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the student's code raises is reported, not re-raised
        raise StudentError(describe(error, what, path, rank)) from None


def describe(error: BaseException, what: str, path: str, rank: int | None = None) -> str:
    """``"your MyDDP raised ValueError on rank 2: <message> (line 14 of ddp_by_hand.py)"``."""
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if os.path.abspath(frame.filename) == os.path.abspath(path):
            where = f" (line {frame.lineno} of {os.path.basename(path)})"
            break
    on = "" if rank is None else f" on rank {rank}"
    subject = what if what.startswith("importing") else f"your {what}"
    return f"{subject} raised {type(error).__name__}{on}: {error}{where}"
