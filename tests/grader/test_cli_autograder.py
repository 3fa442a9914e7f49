"""autograder/: the Gradescope scripts call the grader and always leave a results.json (no rank is run here).

The submission is a notebook instead of a script, which the grader answers at once, so this takes a couple
of seconds (one interpreter importing the grader).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.checks import CHECKS
from grader.labs import LABS

pytestmark = pytest.mark.unit6
AUTOGRADER = Path(__file__).resolve().parents[2] / "autograder"
SCRIPTS = ("setup.sh", "run_autograder", "make_zip.sh")


def gradescope_dirs(tmp_path: Path) -> Path:
    """The layout Gradescope gives run_autograder: source/, submission/, results/ under one root."""
    (tmp_path / "source").symlink_to(AUTOGRADER.parent)
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "train_4gpu.ipynb").write_text("{}")
    return tmp_path


def run_autograder(root: Path, python: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": python}
    return subprocess.run(["bash", str(AUTOGRADER / "run_autograder")], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_scripts_are_executable_bash(name):
    path = AUTOGRADER / name
    assert os.access(path, os.X_OK), f"chmod +x autograder/{name}: Gradescope runs it directly"
    assert path.read_text().startswith("#!/usr/bin/env bash\n")
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def test_run_autograder_grades_the_submission_with_the_grader(tmp_path):
    assert "-m grader.run_autograder" in (AUTOGRADER / "run_autograder").read_text()
    root = gradescope_dirs(tmp_path)
    done = run_autograder(root, sys.executable)
    assert done.returncode == 0, done.stderr
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 0 and "notebook" in data["output"] and len(data["tests"]) == len(CHECKS)


def test_run_autograder_writes_results_even_when_the_grader_cannot_start(tmp_path):
    root = gradescope_dirs(tmp_path)
    done = run_autograder(root, str(tmp_path / "no-python"))
    assert done.returncode == 0
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 0 and "could not start" in data["output"]


@pytest.mark.skipif(shutil.which("zip") is None, reason="the zip command is not installed")
def test_make_zip_puts_the_scripts_at_the_root_next_to_the_source(tmp_path):
    zipped = tmp_path / "autograder.zip"
    subprocess.run(["bash", str(AUTOGRADER / "make_zip.sh"), str(zipped)], check=True, capture_output=True)
    names = set(subprocess.run(["unzip", "-Z1", str(zipped)], capture_output=True, text=True,
                               check=True).stdout.split())
    assert {"setup.sh", "run_autograder", "pyproject.toml", "README.md", "grader/cli.py",
            "notebooks/assignment/train_4gpu_skeleton.py"} <= names
    assert not any("__pycache__" in n for n in names)


def test_on_gradescope_a_lab_only_submission_gets_its_lab_tests_only(tmp_path):
    root = gradescope_dirs(tmp_path)
    (root / "submission" / "train_4gpu.ipynb").unlink()
    stub = AUTOGRADER.parent / "grader" / "labs" / "ring" / "stub.py"
    shutil.copyfile(stub, root / "submission" / "ring_allreduce.py")  # the stub: no rank is started
    done = run_autograder(root, sys.executable)
    assert done.returncode == 0, done.stderr
    data = json.loads((root / "results" / "results.json").read_text())
    assert [test["name"].split(":")[0] for test in data["tests"]] == ["lab ring"] * len(LABS["ring"].checks)
    assert data["score"] == 0 and "graded the lab(s) submitted: ring" in data["output"]
    assert "bad submission" not in data["output"] and "0 / 100" not in done.stdout
