"""What was submitted: the one Python script to grade, or a clear refusal saying what to submit instead.

    script = find_script(Path("alice/"))      # the script in the folder, or BadSubmission with the fix

A submission is refused before anything runs when it is missing, a notebook, not a .py file, one of several
candidates, empty, not UTF-8 text, not valid Python, the unchanged starter or skeleton, or not a training
script.
"""

from __future__ import annotations

import json
from pathlib import Path

from grader.assignment import ASSIGNMENT, Assignment
from grader.environment import ROOT

STARTER = ROOT / "notebooks" / "assignment" / "train_1gpu.py"
SKELETON = ROOT / "notebooks" / "assignment" / "train_4gpu_skeleton.py"


class BadSubmission(ValueError):
    """The submission cannot be run: the message says what was expected and how to fix it."""


def find_script(path: Path, assignment: Assignment = ASSIGNMENT) -> Path:
    """The Python script to grade: ``path`` itself, or the one script in the folder ``path``.

    Raises:
        BadSubmission: missing, a notebook, not a .py file, several candidates, empty, not text, not
            valid Python, the unchanged starter, or not a training script.
    """
    path = Path(path)
    if path.is_dir():
        scripts = sorted(path.rglob("*.py"))
        named = [p for p in scripts if p.name == assignment.script_name]
        if named or len(scripts) == 1:
            path = (named or scripts)[0]
        elif not scripts:
            notebooks = sorted(path.rglob("*.ipynb"))
            path = notebooks[0] if notebooks else path / assignment.script_name
        else:
            raise BadSubmission(f"the submission holds {len(scripts)} Python files and none is named "
                                f"{assignment.script_name}: submit {assignment.script_name} alone.")
    _check_script(path, assignment)
    return path


def _check_script(path: Path, assignment: Assignment) -> None:
    if not path.is_file():
        raise BadSubmission(f"no file {path.name} was submitted: submit your {assignment.script_name}.")
    if path.suffix == ".ipynb":
        raise BadSubmission(f"{path.name} is a notebook, not a script: submit runs/{assignment.script_name}, the "
                            "script you wrote for notebook 06 (torchrun runs scripts, not notebooks).")
    if path.suffix != ".py":
        raise BadSubmission(f"{path.name} is not a Python script: submit {assignment.script_name}.")
    raw = path.read_bytes()
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadSubmission(f"{path.name} is not UTF-8 text: submit the Python source file.") from None
    if not source.strip():
        raise BadSubmission(f"{path.name} is empty: submit your {assignment.script_name}.")
    try:
        compile(source, path.name, "exec")
    except SyntaxError as error:
        raise BadSubmission(f"{path.name} is not valid Python: {error.msg} at line {error.lineno}. Run it once "
                            "yourself (the notebook's run cell) before submitting.") from None
    if _unchanged(source, STARTER):
        raise BadSubmission("this is the unchanged single-device starter: submit your 4-GPU version.")
    if _unchanged(source, SKELETON):
        raise BadSubmission(f"this is the unchanged skeleton ({SKELETON.name}): nothing was converted yet. Do "
                            "its TODOs (notebook 06 walks you through them, notebook 05 has each piece), then check "
                            "it again.")
    if "torch" not in source and "course" not in source:
        raise BadSubmission(f"{path.name} imports neither torch nor course: this is not the assignment's "
                            "training script.")


def _unchanged(source: str, original: Path) -> bool:
    """``source`` is the course file ``original`` as shipped (line endings and trailing spaces aside)."""
    if not original.is_file():
        return False
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]
    return lines(source) == lines(original.read_text())


def submitter_ids(path: Path, metadata: Path | None = None) -> tuple[str, ...]:
    """Who the submission at ``path`` is from, as the grader knows it: every spelling of their id, first the one
    a lab's variant is drawn from when the file names someone else (see :mod:`grader.labs.variant`).

    With Gradescope's ``submission_metadata.json`` (``metadata``): each submitter's student id (``sid``), e-mail
    and its part before the ``@``, in that order. Without it (``grader grade`` of a class folder): the name of the
    student's folder or file, ``alice/`` or ``alice.py`` -> ``alice``. An unreadable metadata file gives ``()``.
    """
    if metadata is None:
        path = Path(path)
        return (path.stem if path.is_file() else path.name,)
    try:
        users = json.loads(Path(metadata).read_text(encoding="utf-8")).get("users") or []
    except (OSError, ValueError, AttributeError):
        return ()
    ids: list[str] = []
    for user in users if isinstance(users, list) else []:
        email = str(user.get("email") or "") if isinstance(user, dict) else ""
        found = (str(user.get("sid") or ""), email, email.partition("@")[0]) if isinstance(user, dict) else ()
        ids += [i for i in found if i and i not in ids]
    return tuple(ids)
