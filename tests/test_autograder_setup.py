"""autograder/: setup.sh then run_autograder, end to end, in a scratch AUTOGRADER_ROOT and without the network.

The zip that make_zip.sh builds is unpacked in ROOT/source as Gradescope does; setup.sh then installs torch and
the grader into a pre-made ROOT/venv (the environment running these tests, reached through a .pth file), with
pip's --no-index: anything it would have to download makes the test fail instead. run_autograder then grades a
correct, a broken, an empty and a notebook submission; every results.json is checked against Gradescope's
specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/). Only the correct submission
runs 4 ranks; the others are refused before any rank starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from grader.checks import CHECKS

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

pytestmark = pytest.mark.unit6
REPO = Path(__file__).resolve().parent.parent
AUTOGRADER = REPO / "autograder"
SUBMISSIONS = Path(__file__).parent / "submissions"
VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
TOP_LEVEL = {"score": (int, float), "execution_time": (int, float), "output": str, "output_format": FORMATS,
             "test_output_format": FORMATS, "test_name_format": FORMATS, "visibility": VISIBILITIES,
             "stdout_visibility": VISIBILITIES, "extra_data": dict, "tests": list, "leaderboard": list}
TEST_CASE = {"score": (int, float), "max_score": (int, float), "status": {"passed", "failed"}, "name": str,
             "name_format": FORMATS, "number": str, "output": str, "output_format": FORMATS, "tags": list,
             "visibility": VISIBILITIES, "extra_data": dict}
OFFLINE = "--no-index --no-build-isolation"
# any attempt to reach a host through pip fails at once instead of waiting for a timeout
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "PIP_NO_INDEX": "1"}


def problems(data: object) -> list[str]:
    """Where ``data`` departs from Gradescope's results.json specification (keys, types, allowed values)."""
    if not isinstance(data, dict):
        return [f"results.json must hold an object, got {type(data).__name__}"]
    found = _fields(data, TOP_LEVEL, "results")
    tests = data.get("tests", [])
    if "score" not in data and (not tests or any("score" not in t for t in tests if isinstance(t, dict))):
        found.append("score is required at the top level unless every test has one")
    for i, test in enumerate(tests if isinstance(tests, list) else []):
        if not isinstance(test, dict):
            found.append(f"tests[{i}] must be an object")
            continue
        found += _fields(test, TEST_CASE, f"tests[{i}]")
        if not all(isinstance(tag, str) for tag in test.get("tags", [])):
            found.append(f"tests[{i}].tags must be strings")
    return found


def _fields(data: dict, spec: dict, where: str) -> list[str]:
    found = [f"{where} has a key Gradescope does not define: {key!r}" for key in data if key not in spec]
    for key, allowed in spec.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(allowed, set):
            ok = value in allowed
        else:
            ok = isinstance(value, allowed) and not isinstance(value, bool)
        if not ok:
            found.append(f"{where}.{key} = {value!r} is not one of {allowed}")
    return found


def test_the_validator_catches_what_gradescope_rejects():
    assert problems({"score": 1.0, "tests": [{"score": 1, "name": "a", "status": "passed"}]}) == []
    assert problems({"tests": [{"name": "a"}]})  # no score anywhere
    assert problems({"score": "10"}) and problems({"score": True}) and problems({"visibility": "public"})
    assert problems({"score": 0, "tests": [{"score": 0, "status": "error"}]})
    assert problems({"score": 0, "tests": [{"score": 0, "number": 1}]}) and problems({"score": 0, "colour": 1})


def torch_requirement_in_setup() -> str:
    return re.search(r'^TORCH_REQUIREMENT="([^"]+)"', (AUTOGRADER / "setup.sh").read_text(), re.M).group(1)


def test_setup_pins_torch_to_the_course_range():
    pinned = Requirement(torch_requirement_in_setup())
    text = (REPO / "pyproject.toml").read_text()
    if tomllib is not None:
        dependencies = tomllib.loads(text)["project"]["dependencies"]
    else:
        dependencies = re.findall(r'^\s*"([^"]+)",', text, re.M)
    course = next(Requirement(d) for d in dependencies if Requirement(d).name == "torch")
    assert pinned.name == "torch" and pinned.specifier == course.specifier
    assert Version("2.13.0") in pinned.specifier and Version("3.0") not in pinned.specifier


def unpack_autograder_zip(root: Path) -> Path:
    """ROOT/source as Gradescope makes it: the zip's contents (built by make_zip.sh when zip is installed)."""
    source = root / "source"
    if shutil.which("zip"):
        zipped = root / "autograder.zip"
        subprocess.run(["bash", str(AUTOGRADER / "make_zip.sh"), str(zipped)], check=True, capture_output=True)
        with zipfile.ZipFile(zipped) as archive:
            archive.extractall(source)
        zipped.unlink()
    else:
        source.mkdir()
        for name in ("setup.sh", "run_autograder"):
            shutil.copy(AUTOGRADER / name, source / name)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, source / name)
        for name in ("course", "grader", "notebooks/assignment"):
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    return source


def premade_venv(root: Path) -> Path:
    """ROOT/venv without pip or torch of its own: it sees this environment's packages through a .pth file."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "this-environment.pth").write_text("\n".join(sorted(here)) + "\n")
    return venv


@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Path:
    """A scratch AUTOGRADER_ROOT after setup.sh ran in it, offline."""
    root = tmp_path_factory.mktemp("autograder")
    source = unpack_autograder_zip(root)
    premade_venv(root)
    (source / "torch-index-url").write_text("# the instructor's mirror\nfile:///mirror/torch/cpu\n")
    env = {**os.environ, **NO_NETWORK, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PIP_OPTIONS": OFFLINE}
    env.pop("TORCH_INDEX_URL", None)
    done = subprocess.run(["bash", str(source / "setup.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{torch_requirement_in_setup()} from file:///mirror/torch/cpu" in done.stdout  # the file next to it
    return root


def run_autograder(root: Path, files: dict[str, str]) -> dict:
    """Put ``files`` in ROOT/submission, run ROOT/source/run_autograder as Gradescope does, return results.json."""
    submission = root / "submission"
    shutil.rmtree(submission, ignore_errors=True)
    submission.mkdir()
    for name, text in files.items():
        (submission / name).write_text(text)
    env = {**os.environ, **NO_NETWORK, "AUTOGRADER_ROOT": str(root)}
    env.pop("AUTOGRADER_PYTHON", None)  # the venv setup.sh made
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((root / "results" / "results.json").read_text())
    assert problems(data) == [], problems(data)
    assert len(data["tests"]) == len(CHECKS) and data["score"] == sum(t["score"] for t in data["tests"])
    assert data["visibility"] == "visible"
    return data


def notebook_of(script: str) -> str:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%%writefile train_4gpu.py\n" + script)]
    return nbformat.writes(notebook)


@pytest.mark.parametrize("files, phrase", [
    ({"train_4gpu.py": "import torch\n\ndef main(:\n    pass\n"}, "not valid Python"),
    ({}, "no file train_4gpu.py was submitted"),
    ({"train_4gpu.ipynb": notebook_of((SUBMISSIONS / "reference.py").read_text())}, "is a notebook, not a script"),
], ids=["broken", "empty", "notebook"])
def test_a_refused_submission_gets_zero_and_the_reason(autograder, files, phrase):
    data = run_autograder(autograder, files)
    assert data["score"] == 0 and phrase in data["output"] and data["output"].startswith("status: bad submission")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_reference_gets_full_marks_through_gradescope(autograder):
    data = run_autograder(autograder, {"train_4gpu.py": (SUBMISSIONS / "reference.py").read_text()})
    assert data["output"].startswith("status: ok") and data["score"] == sum(t["max_score"] for t in data["tests"])
