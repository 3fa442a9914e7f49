"""Render saved results: Gradescope ``results.json``, a CSV gradebook, a feedback text per student.

Every function here reads :class:`~grader.results.Results` only; nothing re-runs a submission.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from grader.checks import CHECKS
from grader.labs import grade as labs
from grader.results import FINISHED, Results


def feedback(results: Results, visible_only: bool = False) -> str:
    """The text a student reads: status, one line per check (what passed, what to fix), then the output."""
    lines = [f"{results.submission}: {results.score:g} / {results.max_score:g} points   "
             f"status: {results.grade_status}"]
    if results.not_assessed and not results.violation:
        lines.append(f"  ({results.raw_score:g} of the {results.assessed_max_score:g} points that could be assessed, "
                     f"scaled to {results.max_score:g}: {len(results.not_assessed)} check(s) could not be assessed)")
    if results.violation:
        lines.append(f"  {withheld(results)}")
    if results.status != "ok" or results.detail != FINISHED:  # how it ended, or a note on a normal end
        lines.append(f"  {results.detail}")
    shown = [c for c in results.checks if not visible_only or c.visibility == "visible"]
    for check in shown:
        if check.ran and not check.assessed:
            lines.append(f"  [NOT ASSESSED] {check.title} (its {check.max_score:g} points left out of the total): "
                         f"{check.message}")
        elif check.ran:
            mark = "PASS" if check.passed else "FAIL"
            lines.append(f"  [{mark}] {check.title} ({check.score:g}/{check.max_score:g}): {check.message}")
    not_run = [c for c in shown if not c.ran]
    if not_run:  # the reason is the detail above, said once
        lines.append(f"  Not run, so 0 points ({len(not_run)} checks):")
        lines += [f"  [NOT RUN] {c.title} (0/{c.max_score:g})" for c in not_run]
    if results.output.strip():
        lines += ["", results.output.rstrip()]
    lines += labs.feedback(results.labs)
    return "\n".join(lines) + "\n"


def withheld(results: Results) -> str:
    """Why a :attr:`~grader.results.Results.violation` withholds the score, and what happens next."""
    return (f"INTEGRITY VIOLATION: {results.violation} The score is withheld (0 instead of "
            f"{results.raw_score:g} / {results.max_score:g}) until the instructor reviews the run "
            f"(run status: {results.status}).")


def gradescope(results: Results) -> dict:
    """The Gradescope autograder ``results.json`` for one submission."""
    return {
        "score": results.score + labs.total(results.labs),
        "execution_time": round(results.elapsed_s, 1),
        "output": (f"status: {results.grade_status}. " + (f"{withheld(results)} " if results.violation else "")
                   + results.detail),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": [{"name": c.title, "number": str(i + 1), "score": c.score, "max_score": c.max_score,
                   "visibility": c.visibility, "status": "passed" if c.passed else "failed",
                   "output": c.message if c.assessed else f"not assessed (points left out of the total): {c.message}"}
                  for i, c in enumerate(results.checks)]
                 + [{**test, "number": str(len(results.checks) + i + 1)}
                    for i, test in enumerate(labs.gradescope_tests(results.labs))],
    }


def write_gradescope(results: Results, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gradescope(results), indent=2))


def gradebook_columns() -> list[str]:
    return ["submission", "status", "score", "max_score", "raw_score", *(c.name for c in CHECKS), "test_accuracy",
            "elapsed_s", "detail", *labs.columns()]


def write_gradebook(all_results: list[Results], path: Path) -> None:
    """CSV: a points-possible row, then one row per submission (sorted by name), with a status column.

    A submission whose records cannot be trusted has status ``integrity violation``, score 0, its raw score in
    ``raw_score`` (the sum of its checks) and the reason first in ``detail``: for the instructor to review.
    """
    path = Path(path)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(gradebook_columns())
        possible = sum(c.points for c in CHECKS)
        writer.writerow(["points possible", "", possible, possible, possible, *(c.points for c in CHECKS),
                         "", "", "", *labs.points_possible()])
        for results in sorted(all_results, key=lambda r: r.submission):
            scores = {c.name: c.score if c.assessed else "not assessed" for c in results.checks}
            accuracy = "" if results.test_accuracy is None else f"{results.test_accuracy:.4f}"
            detail = f"{withheld(results)} {results.detail}" if results.violation else results.detail
            writer.writerow([results.submission, results.grade_status, results.score, results.max_score,
                             results.raw_score, *(scores.get(c.name, 0.0) for c in CHECKS), accuracy,
                             f"{results.elapsed_s:.1f}", detail, *labs.scores(results.labs)])
    tmp.replace(path)
