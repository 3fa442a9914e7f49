"""Labs: the student writes the real distributed code (a ring allreduce, DDP, ZeRO), checked on N ranks.

A lab takes two cells in its notebook. :func:`start` writes the lab's file (``labs/ring_allreduce.py``) from its
stub, only when the file is missing or still the stub: a learner's edits are never overwritten, and
``start(lab, reset=True)`` starts over (keeping the edited file beside it). It shows the file and how to reset.
:func:`check` runs the lab's checks; the checks live with the grader's (:mod:`grader.labs`), so a notebook's
self-check, ``grader check`` and ``grader grade`` run the same code. A lab not attempted yet gets one line, so a
notebook run top to bottom over untouched labs stays short. Taught from notebook 04 on.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grader.results import LabResult

__all__ = ["check", "start"]

#: Where a reset keeps the learner's edited file: ``labs/ring_allreduce.py`` -> ``labs/ring_allreduce.py.bak``.
BACKUP_SUFFIX = ".bak"


def _stub_of(lab: str) -> tuple[Path, Path, str]:
    """(the student's file, relative to the notebook's folder; the packaged stub; the function to write first)."""
    from grader import labs  # the grader builds on the course: imported when a lab is used

    spec = labs.get(lab)
    return Path(spec.student_file), labs.core.stub_path(spec), spec.entry  # stub_path: wherever the stubs live


def is_untouched(path: Path, stub: Path) -> bool:
    """True when ``path`` is missing or still the stub byte for byte: nothing of the learner's is in it."""
    return not path.is_file() or path.read_bytes() == stub.read_bytes()


def start(lab: str, reset: bool = False) -> None:
    """Write ``lab``'s file from its stub unless the learner has edited it, then show it.

    Args:
        lab: the lab's name, e.g. ``"ring"`` (see ``grader.labs.LABS``).
        reset: overwrite an edited file with the stub; the edited one is kept as ``<file>.bak``.

    The file is the lab's ``student_file``, relative to the notebook's folder (``labs/ring_allreduce.py``).

    Raises:
        ValueError: no lab called ``lab``.
    """
    path, stub, entry = _stub_of(lab)
    if is_untouched(path, stub):
        said = "still the lab's starting point" if path.is_file() else "written from the lab's starting point"
    elif reset:
        backup = path.with_name(path.name + BACKUP_SUFFIX)
        shutil.copyfile(path, backup)
        said = f"the lab's starting point again; your version is saved as {backup}"
    else:
        said = "your version, kept as you left it"
    if reset or not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stub, path)
    _show(path, f"{path} is {said}. Open it in JupyterLab's editor and write `{entry}`, then run the check cell. "
                f"To start over from the stub: `labs.start(\"{lab}\", reset=True)`.")


def _show(path: Path, message: str) -> None:
    """The message, then the file: as Markdown in Jupyter, as plain text elsewhere."""
    text = path.read_text()
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None  # noqa: N806 - the same name as IPython's, missing
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(f"{message}\n\n<details><summary>{path}</summary>\n\n```python\n{text}\n```\n</details>"))
    else:
        print(f"{message}\n\n{text}")


def check(lab: str, path: str | None = None, hidden: bool = False, quiet: bool = False) -> LabResult:
    """Check the student's file for ``lab`` and print the feedback; never raises for a wrong submission.

    A file still the stub (or missing) gets one line, not one per check: it is not attempted yet.

    Args:
        lab: the lab's name, e.g. ``"ring"`` (see ``grader.labs.LABS``).
        path: the student's file; default the lab's ``student_file`` (relative to ``notebooks/``).
        hidden: also run the grader's hidden runs and checks.
        quiet: return the result without printing it.

    Returns:
        The lab's :class:`~grader.results.LabResult` (``.passed``, ``.score``, ``.failed()``, ``.checks``).

    Raises:
        ValueError: no lab called ``lab``.
    """
    from grader import labs  # the grader builds on the course: imported here, when a check is asked for

    student_file, stub, entry = _stub_of(lab)
    mine = Path(path) if path else student_file
    if quiet or not is_untouched(mine, stub):
        return labs.check(lab, path, hidden=hidden, quiet=quiet)
    result = labs.check(lab, path, hidden=hidden, quiet=True)
    if mine.is_file():
        print(f"Lab {lab!r}: not attempted yet ({mine} is still the stub): write {entry}, then run this check again.")
    else:
        print(f"Lab {lab!r}: {mine} does not exist yet: run labs.start({lab!r}) above, then this check.")
    return result
