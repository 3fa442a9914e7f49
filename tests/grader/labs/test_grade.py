"""grader.labs.grade: labs found in a student's folder by file name, run in the sandbox, graded with the assignment
(grader.grading), one gradebook column, one feedback section and one Gradescope test per check."""

import csv
import json
import os
import shutil

import pytest

from grader import cli, render
from grader.labs import LABS, variant
from grader.labs import grade as labs
from grader.runner import GradingConfig

pytestmark = pytest.mark.timeout(900)
RING = LABS["ring"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SOLUTION = os.path.join(ROOT, "grader", "labs", "ring", "reference.py")
STUB = os.path.join(ROOT, "grader", "labs", "ring", "stub.py")


def test_a_lab_is_found_by_its_file_name_anywhere_in_a_folder_or_as_the_submission(tmp_path):
    (tmp_path / "alice" / "labs").mkdir(parents=True)
    shutil.copyfile(SOLUTION, tmp_path / "alice" / "labs" / "ring_allreduce.py")
    (tmp_path / "alice" / "train_4gpu.py").write_text("print('hi')\n")
    assert labs.lab_files(tmp_path / "alice") == {"ring": tmp_path / "alice" / "labs" / "ring_allreduce.py"}
    assert labs.lab_files(tmp_path / "alice" / "labs" / "ring_allreduce.py") == {
        "ring": tmp_path / "alice" / "labs" / "ring_allreduce.py"}
    assert labs.lab_files(tmp_path / "alice" / "train_4gpu.py") == {}
    assert not labs.only_labs(tmp_path / "alice") and labs.only_labs(tmp_path / "alice" / "labs")


def test_grading_a_class_gives_each_lab_a_column_feedback_and_gradescope_tests(tmp_path, planted):
    submissions = tmp_path / "submissions"
    for student, source in (("alice", SOLUTION), ("bob", planted("ring", "forgets_average"))):
        (submissions / student).mkdir(parents=True)
        shutil.copyfile(source, submissions / student / "ring_allreduce.py")
    out = tmp_path / "out"
    cli.grade_class(submissions, out, jobs=2, config=GradingConfig(visible_only=True), progress=False)
    with open(out / "gradebook.csv", newline="") as handle:
        rows = {row["submission"]: row for row in csv.DictReader(handle)}
    full = sum(check.points for check in RING.checks)  # every ring check is visible
    assert rows["points possible"]["lab ring"] == rows["alice"]["lab ring"] == f"{full:g}"
    assert rows["bob"]["lab ring"] == f"{full - 4:g}"  # only "equal to dist.all_reduce" (4 points) fails
    assert rows["alice"]["status"] == "labs only" and rows["alice"]["score"] == ""  # no assignment: no 0 / 100
    feedback = (out / "feedback" / "bob.txt").read_text()
    assert "Lab 'ring'" in feedback and f"Score: {full - 4:g}/{full:g}" in feedback
    assert "it holds the sum, not the average" in feedback
    assert "/ 100" not in feedback and "NOT RUN" not in feedback
    # the class folder's name is who a submission is from: each lab is checked on that student's variant
    assert f"Checked on your variant: {variant.describe(RING, 'bob')}." in feedback
    alices = (out / "feedback" / "alice.txt").read_text()  # the solution's file says STUDENT_ID = "solution"
    assert f"Checked on your variant: {variant.describe(RING, 'alice')}." in alices
    assert "sets STUDENT_ID = 'solution', but this submission is from 'alice': it was checked on 'alice''s " \
        "variant." in alices
    tests = json.loads((out / "gradescope" / "bob" / "results.json").read_text())["tests"]
    lab_tests = {t["name"]: t for t in tests if t["name"].startswith("lab ring: ")}
    assert len(lab_tests) == len(tests) == len(RING.checks) and sum(t["score"] for t in lab_tests.values()) == full - 4
    assert lab_tests["lab ring: equal to dist.all_reduce on every rank (sum and avg; float32, float64, bfloat16)"][
        "status"] == "failed"


def test_the_terminal_self_check_of_a_lab(tmp_path, capsys):
    assert cli.main(["check", "ring", STUB]) == 1
    assert "Not attempted yet: your ring_allreduce still raises NotImplementedError" in capsys.readouterr().out
    assert cli.main(["check", "no_such_lab", STUB]) == 2
    error = capsys.readouterr().err
    assert "no lab called 'no_such_lab'; the labs are: " in error and "ring" in error


def test_on_gradescope_a_lab_submitted_alone_is_graded_alone(tmp_path):
    submission = tmp_path / "submission"
    submission.mkdir()
    (tmp_path / "submission_metadata.json").write_text(json.dumps({"users": [{"email": "ada@uni.edu", "sid": "7"}]}))
    shutil.copyfile(STUB, submission / "ring_allreduce.py")
    out = tmp_path / "results.json"
    results = cli.run_autograder(submission, out, config=GradingConfig(visible_only=True))
    data = json.loads(out.read_text())
    assert results.checks == [] and results.status == "labs only" and results.labs["ring"].score == 0
    assert [t["name"].split(":")[0] for t in data["tests"]] == ["lab ring"] * len(RING.checks)
    assert data["score"] == 0 and "graded the lab(s) submitted: ring" in data["output"]
    assert "Not attempted yet" in data["tests"][0]["output"]
    assert f"Lab ring: checked on your variant: {variant.describe(RING, '7')}." in data["output"]  # the submitter's


def test_the_notebooks_self_check_prints_what_grader_check_prints(capsys):
    from course import labs as course_labs

    result = course_labs.check("ring", STUB)
    printed = capsys.readouterr().out  # the notebook says it in one line: the stub is not attempted yet
    assert not result.passed and printed.startswith("Lab 'ring': not attempted yet") and printed.count("\n") == 1
    assert cli.main(["check", "ring", STUB]) == 1
    assert capsys.readouterr().out == render.lab_feedback(result)  # the same result: no rank started, nothing timed
