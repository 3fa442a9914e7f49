"""Grade one submission: its assignment script, if it holds one, and every lab file it holds, into one Results.

    results = grade_submission(Path("alice/"), config)     # then grader.render: feedback, gradebook, Gradescope

The one path every command takes (``grader check``, ``grader grade``, ``grader gradescope``): the assignment is
run by :func:`grader.runner.grade`, each lab found by :func:`grader.labs.grade.grade_labs`, and both land in the
same :class:`~grader.results.Results` (``checks`` and ``labs``) that :mod:`grader.render` renders. A submission of
lab files only gets the status ``labs only`` and no assignment check. Never raises for a submission: the grader's
own failures become a ``grader error`` result.
"""

from __future__ import annotations

import time
from pathlib import Path

from grader.gradebook import GRADER_ERROR
from grader.labs.grade import grade_labs, lab_files, only_labs
from grader.results import LABS_ONLY, Results
from grader.runner import GradingConfig, grade, not_run


def grade_submission(path: Path, config: GradingConfig, student_ids: tuple[str, ...] = ()) -> Results | None:
    """Grade ``path`` (a script, a lab file, or a folder of them); None if ``config.stop`` was set before it began.

    Args:
        path: the submission.
        config: the grading's settings; ``visible_only`` runs the visible checks (the self-check), and the labs'
            visible runs only.
        student_ids: who the submission is from, when the grader knows (:func:`grader.submission.submitter_ids`):
            each lab is checked on that student's variant; empty: on the variant its file's ``STUDENT_ID`` names.

    Returns:
        The submission's Results: the assignment's check results (none for lab files only) and each lab's.
    """
    path, start = Path(path), time.monotonic()
    if config.stop is not None and config.stop.is_set():
        return None
    try:
        if only_labs(path):  # lab files alone: no assignment script to run (not even a lab file taken for one)
            labs = ", ".join(lab_files(path))
            results = Results(path.name, LABS_ONLY, f"graded the lab(s) submitted: {labs} (no assignment script)")
        else:
            results = grade(path, config)
    except Exception as error:  # noqa: BLE001  (one submission must never stop the batch)
        results = not_run(path.name, GRADER_ERROR, f"{type(error).__name__}: {error}", config)
    try:
        results.labs = grade_labs(path, hidden=not config.visible_only, isolation=config.isolation, stop=config.stop,
                                  student_ids=student_ids)
    except Exception as error:  # noqa: BLE001  (a lab's grader failure must not lose the assignment's grade)
        results.detail += f" (the labs could not be graded: {type(error).__name__}: {error})"
    results.elapsed_s = time.monotonic() - start
    return results
