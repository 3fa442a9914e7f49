"""Labs: the student writes the real distributed code (a ring allreduce, DDP, ZeRO), checked on N ranks.

The stubs that a notebook's ``%%writefile labs/<file>.py`` cell writes are in each lab's folder
(``grader/labs/<lab>/stub.py``), beside its check (:mod:`grader.labs`). :func:`check` here is the notebooks' way
in, so that a notebook's self-check, ``grader check`` and ``grader grade`` run the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grader.results import LabResult

__all__ = ["check"]


def check(lab: str, path: str | None = None, hidden: bool = False, quiet: bool = False) -> LabResult:
    """Check the student's file for ``lab`` and print the feedback; never raises for a wrong submission.

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

    return labs.check(lab, path, hidden=hidden, quiet=quiet)
