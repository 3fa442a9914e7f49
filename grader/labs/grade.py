"""Grade the labs a student submitted (grader.labs), each in the same sandbox as the assignment's run.

A lab is found in a submission by its file name (``ring_allreduce.py`` for the ring lab: the file the notebook's
``%%writefile`` cell wrote), anywhere in the student's folder, or as the submission itself. :func:`grade_labs`
runs each one found with :mod:`grader.labs.in_sandbox` inside :func:`grader.sandbox.run` (a fresh directory
holding only that file, the grader's limits, loopback only) and returns a :class:`~grader.results.LabResult` per
lab, which :class:`grader.results.Results` keeps under ``labs`` and :mod:`grader.render` renders with the
assignment's: one gradebook column, one feedback section, one Gradescope test per check. ``grader grade`` runs
the hidden runs and checks; the self-check (``grader check ring FILE``) only the visible ones, in the student's
own process. :func:`grader.grading.grade_submission` calls this.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from grader import sandbox
from grader import secret as instructor_secret
from grader.environment import python_argv, run_env
from grader.labs import LABS, Lab
from grader.results import CheckResult, LabResult

#: the sandbox's limits for one lab: every run of it, hidden ones included (8 ranks at most)
LAB_LIMITS = sandbox.Limits(wall_s=420.0)


def lab_files(submission: Path) -> dict[str, Path]:
    """Lab name -> the student's file for it, for each lab whose file the submission holds (first by path)."""
    submission = Path(submission)
    found = {}
    for name, lab in LABS.items():
        wanted = os.path.basename(lab.student_file)
        if submission.is_file():
            candidates = [submission] if submission.name == wanted else []
        else:
            candidates = sorted(p for p in submission.rglob(wanted) if p.is_file())
        if candidates:
            found[name] = candidates[0]
    return found


def only_labs(submission: Path) -> bool:
    """True if every Python file of the submission is a lab's file: then it holds no assignment script."""
    submission = Path(submission)
    found = set(lab_files(submission).values())
    files = [submission] if submission.is_file() else [p for p in submission.rglob("*.py") if p.is_file()]
    return bool(found) and all(path in found for path in files)


def grade_labs(submission: Path, hidden: bool = True, isolation: str = "auto",
               stop: threading.Event | None = None, student_ids: tuple[str, ...] = ()) -> dict[str, LabResult]:
    """Grade every lab found in ``submission``; lab name -> its result. ``student_ids``: who it is from, if the
    grader knows (each lab is then checked on that student's variant, see :mod:`grader.labs.variant`)."""
    return {name: grade_lab(LABS[name], path, hidden, isolation, stop, student_ids=student_ids)
            for name, path in lab_files(submission).items()}


def grade_lab(lab: Lab, path: Path, hidden: bool = True, isolation: str = "auto",
              stop: threading.Event | None = None, limits: sandbox.Limits = LAB_LIMITS,
              student_ids: tuple[str, ...] = ()) -> LabResult:
    """Check one lab file in the sandbox; always returns a result (every check failed if the run broke)."""
    with tempfile.TemporaryDirectory(prefix="grade-lab-") as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        name = os.path.basename(lab.student_file)
        shutil.copyfile(path, run_dir / name)
        read, write = os.pipe()
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(_read_all(read)), daemon=True)
        reader.start()
        argv = [*python_argv(), "-m", "grader.labs.in_sandbox", lab.name, name, "--result-fd", str(write)]
        argv += [f"--student-id={student_id}" for student_id in student_ids]
        try:
            result = sandbox.run(argv + (["--hidden"] if hidden else []), cwd=run_dir, env=run_env(), limits=limits,
                                 pass_fds=(write,), isolation=isolation, stop=stop,
                                 hide=(str(instructor_secret.secret_path()),))
        finally:
            os.close(write)
            reader.join(timeout=30)
    return _verdict(lab, str(path), received[0] if received else b"", result, hidden)


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _verdict(lab: Lab, path: str, raw: bytes, result: Any, hidden: bool) -> LabResult:
    """The lab's result as in_sandbox wrote it, or every check failed with how the sandboxed run ended."""
    try:
        verdict = LabResult.from_dict(json.loads(raw.decode()))
        return replace(verdict, path=path)
    except (ValueError, TypeError, UnicodeDecodeError):
        pass
    why = result.detail or f"the lab's run ended with status {result.status}"
    tail = result.stderr.strip().splitlines()[-1:] if result.stderr else []
    message = f"the lab could not be checked: {why}" + (f" (last error line: {tail[0]})" if tail else "")
    checks = tuple(CheckResult.of(c, False, message) for c in lab.checks if hidden or not c.hidden)
    return LabResult(lab.name, lab.title, path, checks, round(result.elapsed_s, 2), 0, hidden, result.status)
