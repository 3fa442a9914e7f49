"""grader.runner without running anything: bad submissions get a clear message, the starter matches the rubric."""

import runpy
from pathlib import Path

import nbformat
import pytest

from grader import render
from grader.assignment import ASSIGNMENT
from grader.checks import CHECKS
from grader.runner import BAD, grade
from grader.secret import submission_seed
from grader.submission import SKELETON, STARTER, BadSubmission, find_script

pytestmark = pytest.mark.unit6
SUBMISSIONS = Path(__file__).resolve().parents[1] / "submissions"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def notebook(tmp_path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell((SUBMISSIONS / "reference.py").read_text())]
    path = tmp_path / "train_4gpu.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("make, phrase", [
    (lambda t: write(t, "train_4gpu.py", "import torch\n\ndef main(:\n    pass\n"), "not valid Python: "),
    (lambda t: write(t, "train_4gpu.py", "\n  \n"), "is empty"),
    (notebook, "is a notebook, not a script"),
    (lambda t: write(t, "screenshot.txt", "it worked on my machine"), "not a Python script"),
    (lambda t: write(t, "train_4gpu.py", "print('hello')\n"), "not the assignment's training script"),
    (lambda t: write(t, "train_4gpu.py", STARTER.read_text()), "unchanged single-device starter"),
    (lambda t: write(t, "train_4gpu.py", SKELETON.read_text()), "unchanged skeleton"),
    (lambda t: write(t, "train_4gpu.py", SKELETON.read_text().replace("\n", "  \r\n")), "unchanged skeleton"),
    (lambda t: t / "missing.py", "no file missing.py"),
])
def test_bad_submissions_are_named_and_explained(tmp_path, make, phrase):
    path = make(tmp_path)
    with pytest.raises(BadSubmission, match=phrase):
        find_script(path)
    results = grade(path)  # no run: returns at once, every check listed as not run
    assert results.status == BAD and phrase in results.detail
    assert results.score == 0 and len(results.checks) == len(CHECKS) and results.max_score == 100
    assert not any(c.ran or c.passed for c in results.checks)
    text = render.feedback(results)
    assert text.count(phrase) == 1 and text.count("[NOT RUN]") == len(CHECKS)  # the reason said once
    once = render.feedback(results, visible_only=True)  # the self-check: one line, the reason and the fix
    assert once.count("\n") == 1 and phrase in once and "[NOT RUN]" not in once


def test_the_syntax_error_says_where(tmp_path):
    with pytest.raises(BadSubmission, match="line 3"):
        find_script(write(tmp_path, "t.py", "import torch\nx = 1\ndef f(:\n"))


def test_a_folder_submission_finds_its_script(tmp_path):
    write(tmp_path, "README.md", "notes")
    script = write(tmp_path, ASSIGNMENT.script_name, (SUBMISSIONS / "reference.py").read_text())
    write(tmp_path, "helper.py", "import torch\n")
    assert find_script(tmp_path) == script


def test_a_folder_with_several_scripts_and_none_named_right_is_refused(tmp_path):
    write(tmp_path, "a.py", "import torch\n")
    write(tmp_path, "b.py", "import torch\n")
    with pytest.raises(BadSubmission, match="none is named train_4gpu.py"):
        find_script(tmp_path)


def test_the_seed_depends_on_the_content_only(tmp_path):
    a = write(tmp_path, "a.py", "import torch\n")
    b = write(tmp_path, "b.py", "import torch\n")
    c = write(tmp_path, "c.py", "import torch  # changed\n")
    assert submission_seed(a) == submission_seed(b) != submission_seed(c)


def test_the_starter_states_what_the_grader_expects():
    starter = runpy.run_path(str(STARTER), run_name="starter")
    assert starter["LR"] == ASSIGNMENT.base_lr
    assert starter["BATCH_SIZE"] == ASSIGNMENT.base_batch_size
    assert starter["EPOCHS"] == ASSIGNMENT.epochs
    assert starter["CHECKPOINT"] == ASSIGNMENT.checkpoint
    assert starter["TARGET_ACCURACY"] == ASSIGNMENT.target_accuracy
