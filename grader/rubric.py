"""Apply the rubric (:data:`grader.checks.CHECKS`) to a run's evidence: one CheckResult per check.

A check that the records did not allow (a field missing where the check needed it) is not assessed, saying it
is the grader's fault, never quoting the grader's exception or its traceback. A check that returns ``passed`` None
could not be assessed on a run that finished (its evidence cannot show): it scores 0 and its points are left out
of the total (:attr:`grader.results.Results.score`).
"""

from __future__ import annotations

import time

from grader.assignment import Assignment
from grader.checks import CHECKS
from grader.checks.common import cannot_assess
from grader.evidence import Evidence
from grader.results import CheckResult, Results


def apply(results: Results, evidence: Evidence | None, assignment: Assignment, visible_only: bool,
          start: float) -> Results:
    """``results`` with one entry per check appended (the ``visible`` ones only with ``visible_only``) and
    its elapsed time since ``start`` (``time.monotonic()``).

    With ``evidence`` None (the submission was not run, or not to the end: ``results.status`` says why)
    every check is listed as not run, with 0 points of its full ``max_score``, so the gradebook's totals stay
    right; the reason is said once, in ``results.detail``.
    """
    for check in CHECKS:
        if visible_only and check.visibility != "visible":
            continue
        if evidence is None:
            results.checks.append(CheckResult(check.name, check.title, 0.0, check.points, check.visibility, False,
                                              f"not run ({results.status}: see above).", ran=False,
                                              voids_score=check.voids_score))
            continue
        try:
            passed, message = check.test(evidence, assignment)
        except (AttributeError, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
            passed, message = cannot_assess("the grader could not evaluate this check on what it recorded (a "
                                            "fault of the grader, not of your script).")
        results.checks.append(CheckResult(check.name, check.title, check.points if passed else 0.0,
                                          check.points, check.visibility, bool(passed), message,
                                          voids_score=check.voids_score, assessed=passed is not None))
    results.elapsed_s = time.monotonic() - start
    return results
