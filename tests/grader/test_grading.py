"""grader.grading: one submission graded through one path, the assignment's script and the labs it holds."""

import shutil
from pathlib import Path

import pytest

from grader import grading, render
from grader.labs import LABS
from grader.runner import GradingConfig

pytestmark = [pytest.mark.unit6, pytest.mark.timeout(300)]

STUB = Path(__file__).resolve().parents[2] / "grader" / "labs" / "ring" / "stub.py"


def test_lab_files_alone_are_graded_as_labs_with_no_assignment_check(tmp_path):
    submission = tmp_path / "zoe"
    submission.mkdir()
    shutil.copyfile(STUB, submission / "ring_allreduce.py")  # the stub: no rank is started
    results = grading.grade_submission(submission, GradingConfig(visible_only=True))
    assert not results.assignment and results.status == "labs only" and results.checks == []
    assert list(results.labs) == ["ring"] and results.labs["ring"].failed() == [c.name for c in LABS["ring"].checks]
    assert results.total == 0 and "graded the lab(s) submitted: ring" in results.detail


def test_a_folder_with_the_assignment_and_a_lab_gets_both_in_one_results(tmp_path):
    submission = tmp_path / "carol"
    submission.mkdir()
    shutil.copyfile(STUB, submission / "ring_allreduce.py")
    (submission / "train_4gpu.py").write_text("")  # refused at once: empty (no rank is started)
    results = grading.grade_submission(submission, GradingConfig(visible_only=True))
    assert results.assignment and results.status == "bad submission" and list(results.labs) == ["ring"]
    tests = render.gradescope(results)["tests"]
    assert len(tests) == len(results.checks) + len(LABS["ring"].checks) and tests[-1]["name"].startswith("lab ring: ")
    text = render.feedback(results)
    assert text.index("[NOT RUN]") < text.index("Lab 'ring'")  # the assignment's checks, then the lab's section


def test_nothing_is_graded_once_the_grading_was_stopped(tmp_path):
    import threading

    stop = threading.Event()
    stop.set()
    assert grading.grade_submission(tmp_path, GradingConfig(stop=stop)) is None
