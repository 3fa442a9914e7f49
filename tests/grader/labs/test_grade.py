"""The grader grades labs: found in a student's folder by file name, run in the sandbox, one gradebook column each."""

import csv
import json
import os
import shutil

import pytest

from grader import cli
from grader.labs import grade as labs
from grader.labs import registry
from grader.runner import GradingConfig

pytestmark = pytest.mark.timeout(900)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SOLUTION = os.path.join(ROOT, "notebooks", "solutions", "labs", "ring_allreduce.py")
STUB = os.path.join(ROOT, "course", "labs", "stubs", "ring_allreduce.py")
FORGETS_AVERAGE = os.path.join(ROOT, "tests", "grader", "labs", "attempts", "ring_forgets_average.py")


def test_a_lab_is_found_by_its_file_name_anywhere_in_a_folder_or_as_the_submission(tmp_path):
    (tmp_path / "alice" / "labs").mkdir(parents=True)
    shutil.copyfile(SOLUTION, tmp_path / "alice" / "labs" / "ring_allreduce.py")
    (tmp_path / "alice" / "train_4gpu.py").write_text("print('hi')\n")
    assert labs.lab_files(tmp_path / "alice") == {"ring": tmp_path / "alice" / "labs" / "ring_allreduce.py"}
    assert labs.lab_files(tmp_path / "alice" / "labs" / "ring_allreduce.py") == {
        "ring": tmp_path / "alice" / "labs" / "ring_allreduce.py"}
    assert labs.lab_files(tmp_path / "alice" / "train_4gpu.py") == {}
    assert not labs.only_labs(tmp_path / "alice") and labs.only_labs(tmp_path / "alice" / "labs")


def test_grading_a_class_gives_each_lab_a_column_feedback_and_gradescope_tests(tmp_path):
    submissions = tmp_path / "submissions"
    for student, source in (("alice", SOLUTION), ("bob", FORGETS_AVERAGE)):
        (submissions / student).mkdir(parents=True)
        shutil.copyfile(source, submissions / student / "ring_allreduce.py")
    out = tmp_path / "out"
    cli.grade_class(submissions, out, jobs=2, config=GradingConfig(visible_only=True), progress=False)
    with open(out / "gradebook.csv", newline="") as handle:
        rows = {row["submission"]: row for row in csv.DictReader(handle)}
    ring = registry.get("ring")
    visible = [c for c in ring.checks if not c.hidden]
    total = sum(c.points for c in visible)
    bob = total - next(c.points for c in visible if c.id == "matches")  # the sum, not the average
    assert rows["points possible"]["lab ring"] == str(total)
    assert rows["alice"]["lab ring"] == str(total) and rows["bob"]["lab ring"] == str(bob)
    feedback = (out / "feedback" / "bob.txt").read_text()
    assert f"Lab ring: {bob} / {total} points" in feedback and "it holds the sum, not the average" in feedback
    tests = json.loads((out / "gradescope" / "bob" / "results.json").read_text())["tests"]
    lab_tests = {t["name"]: t for t in tests if t["name"].startswith("lab ring: ")}
    assert len(lab_tests) == len(visible) and sum(t["score"] for t in lab_tests.values()) == bob
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
    shutil.copyfile(STUB, submission / "ring_allreduce.py")
    out = tmp_path / "results.json"
    results = cli.run_autograder(submission, out, config=GradingConfig(visible_only=True))
    data = json.loads(out.read_text())
    assert results.checks == [] and results.labs["ring"]["score"] == 0
    visible = [c for c in registry.get("ring").checks if not c.hidden]
    assert [t["name"].split(":")[0] for t in data["tests"]] == ["lab ring"] * len(visible)
    assert data["score"] == 0 and "graded the lab(s) submitted: ring" in data["output"]
    assert "Not attempted yet" in data["tests"][0]["output"]
