"""Render saved results: Gradescope ``results.json``, a CSV gradebook, a feedback text per student.

Every function here reads :class:`~grader.results.Results` (or one :class:`~grader.results.LabResult`) only;
nothing re-runs a submission, and the assignment's checks and the labs' are rendered by the same code: one line
per check in the feedback, one Gradescope test per check, one gradebook column per check or lab.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from grader.checks import CHECKS
from grader.results import BAD, FINISHED, CheckResult, LabResult, Results


def feedback(results: Results, visible_only: bool = False) -> str:
    """The text a student reads: the assignment's status and checks (what passed, what to fix), its output, then
    each lab's section (:func:`lab_feedback`). A submission of lab files only gets the labs' sections alone. The
    self-check (``visible_only``) of a script refused before it ran gets one line: why, and what to do."""
    lines = _assignment_feedback(results, visible_only) if results.assignment else [
        f"{results.submission}: {results.detail}"]
    for lab in results.labs.values():
        lines += ["", lab_feedback(lab, visible_only).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _assignment_feedback(results: Results, visible_only: bool) -> list[str]:
    if visible_only and results.status == BAD:  # the self-check of a refused script: nothing ran, say why once
        return [f"{results.submission}: not run, {results.score:g} / {results.max_score:g} points: {results.detail}"]
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
    lines += [check_line(c) for c in shown if c.ran]
    not_run = [c for c in shown if not c.ran]
    if not_run:  # the reason is the detail above, said once
        lines.append(f"  Not run, so 0 points ({len(not_run)} checks):")
        lines += [f"  [NOT RUN] {c.title} (0/{c.max_score:g})" for c in not_run]
    if results.output.strip():
        lines += ["", results.output.rstrip()]
    return lines


def check_line(check: CheckResult, message: bool = True) -> str:
    """One check's line of feedback: ``[PASS]``, ``[FAIL]``, ``[INFO]`` (a 0-point check that passed: a measure) or
    ``[NOT ASSESSED]``, its title, points, message."""
    if not check.assessed:
        return (f"  [NOT ASSESSED] {check.title} (its {check.max_score:g} points left out of the total): "
                f"{check.message}")
    mark = ("INFO" if not check.max_score and not check.voids_score else "PASS") if check.passed else "FAIL"
    said = f": {check.message}" if message and check.message else ""
    return f"  [{mark}] {check.title} ({check.score:g}/{check.max_score:g}){said}"


def lab_feedback(lab: LabResult, visible_only: bool = False) -> str:
    """A lab's feedback, as the self-check prints it and as its section of a graded submission's: one line per
    check with its first failure, then the score and what to do next."""
    lines = [f"Lab {lab.lab!r}: {lab.title} ({lab.path}), {lab.runs} run(s) in {lab.elapsed_s:.1f} s"]
    lines += [f"  Checked on {lab.variant}."] if lab.variant else []
    lines += [f"  {note}" for note in lab.notes]
    shown = [c for c in lab.checks if not visible_only or c.visibility == "visible"]
    messages = {c.message for c in shown}
    once = len(shown) > 1 and len(messages) == 1 and "" not in messages  # e.g. the stub: say it once
    lines += [check_line(c, message=not once) for c in shown]
    if once:
        lines.append(f"  Every check: {messages.pop()}")
    score, max_score = sum(c.score for c in shown), sum(c.max_score for c in shown)
    passed = all(c.passed for c in shown)
    advice = "every check passed." if passed else "fix the first FAIL above, then run this check again."
    lines.append(f"Score: {score:g}/{max_score:g}: {advice}")
    return "\n".join(lines) + "\n"


def withheld(results: Results) -> str:
    """Why a :attr:`~grader.results.Results.violation` withholds the score, and what happens next."""
    return (f"INTEGRITY VIOLATION: {results.violation} The score is withheld (0 instead of "
            f"{results.raw_score:g} / {results.max_score:g}) until the instructor reviews the run "
            f"(run status: {results.status}).")


def variant_lines(results: Results) -> list[str]:
    """Each lab's variant and notes (grader.labs.variant), one line each: "Lab ring: checked on your variant: ..."."""
    lines = []
    for name, lab in results.labs.items():
        lines += [f"Lab {name}: checked on {lab.variant}."] if lab.variant else []
        lines += [f"Lab {name}: {note}" for note in lab.notes]
    return lines


def gradescope(results: Results) -> dict:
    """The Gradescope autograder ``results.json`` for one submission: one test per check, the assignment's (if it
    was submitted) then each lab's (named ``lab <name>: <title>``); the score is theirs together."""
    named = [("", c) for c in results.checks] if results.assignment else []
    named += [(f"lab {name}: ", c) for name, lab in results.labs.items() for c in lab.checks]
    return {
        "score": results.total,
        "execution_time": round(results.elapsed_s, 1),
        "output": (f"status: {results.grade_status}. " + (f"{withheld(results)} " if results.violation else "")
                   + results.detail + "".join(f" {line}" for line in variant_lines(results))),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": [{"name": prefix + c.title, "number": str(i + 1), "score": c.score, "max_score": c.max_score,
                   "visibility": c.visibility, "status": "passed" if c.passed else "failed",
                   "output": c.message if c.assessed else f"not assessed (points left out of the total): {c.message}"}
                  for i, (prefix, c) in enumerate(named)],
    }


def write_gradescope(results: Results, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gradescope(results), indent=2))


def lab_names(all_results: list[Results]) -> list[str]:
    """The labs any of the submissions holds, by name: one gradebook column each."""
    return sorted({name for results in all_results for name in results.labs})


def gradebook_columns(labs: list[str] = ()) -> list[str]:
    return ["submission", "status", "score", "max_score", "raw_score", *(c.name for c in CHECKS), "test_accuracy",
            "elapsed_s", "detail", *(f"lab {name}" for name in labs)]


def write_gradebook(all_results: list[Results], path: Path) -> None:
    """CSV: a points-possible row, then one row per submission (sorted by name), with a status column.

    A submission whose records cannot be trusted has status ``integrity violation``, score 0, its raw score in
    ``raw_score`` (the sum of its checks) and the reason first in ``detail``: for the instructor to review. A
    submission of lab files only has status ``labs only`` and empty assignment columns.
    """
    path = Path(path)
    labs = lab_names(all_results)
    lab_points = [max(r.labs[name].max_score for r in all_results if name in r.labs) for name in labs]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(gradebook_columns(labs))
        possible = sum(c.points for c in CHECKS)
        writer.writerow(["points possible", "", possible, possible, possible, *(c.points for c in CHECKS),
                         "", "", "", *(f"{points:g}" for points in lab_points)])
        for results in sorted(all_results, key=lambda r: r.submission):
            lab_scores = [f"{results.labs[name].score:g}" if name in results.labs else "" for name in labs]
            writer.writerow([results.submission, results.grade_status, *_assignment_cells(results),
                             f"{results.elapsed_s:.1f}", _detail(results), *lab_scores])
    tmp.replace(path)


def _assignment_cells(results: Results) -> list:
    """The gradebook's assignment cells of one submission: score, max, raw, each check, test accuracy."""
    if not results.assignment:
        return [""] * (4 + len(CHECKS))
    scores = {c.name: c.score if c.assessed else "not assessed" for c in results.checks}
    accuracy = "" if results.test_accuracy is None else f"{results.test_accuracy:.4f}"
    return [results.score, results.max_score, results.raw_score, *(scores.get(c.name, 0.0) for c in CHECKS), accuracy]


def _detail(results: Results) -> str:
    return f"{withheld(results)} {results.detail}" if results.violation else results.detail
