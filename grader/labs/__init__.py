"""The labs' checks: the student writes the real distributed code (a ring allreduce, DDP, ZeRO), checked on N ranks.

``course.labs.check("ring", "labs/ring_allreduce.py")`` in a notebook's check cell (it calls :func:`check`
here), or ``grader check ring FILE`` from a terminal, runs the lab's visible checks and prints what is right
and the first thing wrong; ``grader grade`` runs the hidden ones too. The format is in
:mod:`grader.labs.core`, the labs in :mod:`grader.labs.registry`; a lab's results are the assignment's
vocabulary (:mod:`grader.results`) and print with :func:`grader.render.lab_feedback`.
"""

from __future__ import annotations

from grader.labs.core import Finding, Lab, RankFindings, run_lab
from grader.labs.registry import LABS, get
from grader.results import Check, CheckResult, LabResult

__all__ = ["LABS", "Check", "CheckResult", "Finding", "Lab", "LabResult", "RankFindings", "check", "get", "run_lab"]


def check(lab: str, path: str | None = None, hidden: bool = False, quiet: bool = False) -> LabResult:
    """Check the student's file for ``lab`` and print the feedback; never raises for a wrong submission.

    Args:
        lab: the lab's name, e.g. ``"ring"`` (see :data:`LABS`).
        path: the student's file; default the lab's ``student_file`` (relative to ``notebooks/``).
        hidden: also run the grader's hidden runs and checks.
        quiet: return the result without printing it.

    Returns:
        The :class:`LabResult` (``.passed``, ``.score``, ``.failed()``, ``.checks``).

    Raises:
        ValueError: no lab called ``lab``.
    """
    from grader import render  # here: the ranks import this package, and need not load the rubric

    spec = get(lab)
    result = run_lab(spec, path or spec.student_file, hidden=hidden)
    if not quiet:
        print(render.lab_feedback(result), end="")
    return result
