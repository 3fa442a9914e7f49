"""Grade the labs a student submitted (grader.labs), each in the same sandbox as the assignment's run.

A lab is found in a submission by its file name (``ring_allreduce.py`` for the ring lab: the file the notebook's
``%%writefile`` cell wrote), anywhere in the student's folder, or as the submission itself. :func:`grade_labs`
runs each one found with :mod:`grader.labs.in_sandbox` inside :func:`grader.sandbox.run` (a fresh directory holding only
that file, the grader's limits, loopback only) and returns plain data per lab, which :class:`grader.results.Results`
keeps under ``labs`` and the gradebook, the feedback and Gradescope render: one column, one section, one test per
check. ``grader grade`` runs the hidden runs and checks; the self-check (``grader check ring FILE``) only the
visible ones, in the student's own process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from grader import sandbox
from grader import secret as instructor_secret
from grader.environment import python_argv, run_env
from grader.labs import LABS, Lab

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
               stop: threading.Event | None = None) -> dict[str, dict[str, Any]]:
    """Grade every lab found in ``submission``; lab name -> its result (``LabResult.to_dict()`` and ``report``)."""
    return {name: grade_lab(LABS[name], path, hidden, isolation, stop) for name, path in lab_files(submission).items()}


def grade_lab(lab: Lab, path: Path, hidden: bool = True, isolation: str = "auto",
              stop: threading.Event | None = None, limits: sandbox.Limits = LAB_LIMITS) -> dict[str, Any]:
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


def _verdict(lab: Lab, path: str, raw: bytes, result: Any, hidden: bool) -> dict[str, Any]:
    """The lab's result as in_sandbox wrote it, or every check failed with how the sandboxed run ended."""
    import json

    try:
        verdict = json.loads(raw.decode())
        return {**verdict, "status": "ok", "path": path}
    except (ValueError, UnicodeDecodeError):
        pass
    why = result.detail or f"the lab's run ended with status {result.status}"
    tail = result.stderr.strip().splitlines()[-1:] if result.stderr else []
    message = f"the lab could not be checked: {why}" + (f" (last error line: {tail[0]})" if tail else "")
    checks = [c for c in lab.checks if hidden or not c.hidden]
    return {"lab": lab.name, "path": path, "score": 0, "max_score": sum(c.points for c in checks),
            "elapsed_s": round(result.elapsed_s, 2), "status": result.status, "report": message,
            "checks": [{"id": c.id, "title": c.title, "passed": False, "score": 0, "max_score": c.points,
                        "hidden": c.hidden, "message": message} for c in checks]}


# Rendering: what the gradebook, the feedback and Gradescope show of Results.labs (lab name -> grade_lab's dict).

def columns() -> list[str]:
    """The gradebook's lab columns, one per registered lab."""
    return [f"lab {name}" for name in LABS]


def points_possible() -> list[int]:
    """Each lab column's points possible (every check, hidden ones included: ``grade`` runs them)."""
    return [sum(check.points for check in lab.checks) for lab in LABS.values()]


def scores(labs: dict[str, dict[str, Any]]) -> list[Any]:
    """Each lab column's cell: the lab's score, or empty when it was not submitted."""
    return [labs[name]["score"] if name in labs else "" for name in LABS]


def feedback(labs: dict[str, dict[str, Any]]) -> list[str]:
    """The feedback's lab sections: each lab's report, as the self-check prints it."""
    lines = []
    for name, lab in labs.items():
        lines += ["", f"Lab {name}: {lab['score']:g} / {lab['max_score']:g} points (graded from {lab['path']})",
                  lab.get("report", "")]
    return lines


def gradescope_tests(labs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Gradescope tests, one per lab check, named ``lab <name>: <check title>``."""
    return [{"name": f"lab {name}: {check['title']}", "score": check["score"], "max_score": check["max_score"],
             "visibility": "after_published" if check.get("hidden") else "visible",
             "status": "passed" if check["passed"] else "failed", "output": check["message"]}
            for name, lab in labs.items() for check in lab["checks"]]


def total(labs: dict[str, dict[str, Any]]) -> float:
    """The labs' points together."""
    return float(sum(lab["score"] for lab in labs.values()))
