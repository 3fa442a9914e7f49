"""The lab format and its driver: run a student's distributed function on N ranks and say what is wrong.

A lab (:class:`Lab`) is a function the student writes in a notebook cell (``%%writefile labs/<file>.py``), a
list of :class:`Check` s with points, and a ``rank_check`` that runs on every rank of each run: it loads the
student's file, calls it under instrumentation and returns :class:`Finding` s (and, in a :class:`RankFindings`,
evidence such as output tensors that the driver cross-checks outside the ranks with the lab's ``cross_check``).
:func:`run_lab` launches each run with :func:`course.runtime.launch.launch`, merges what every rank found (a
check passes only if it passed on every rank of every run; the first failure is reported, prefixed with its
run) and returns a :class:`LabResult`. A student's exception becomes "your ring_allreduce raised ValueError on
rank 2: ... (line 14 of labs/ring_allreduce.py)", a hang a timeout naming the ranks that waited, never a
traceback from inside the checker. The labs are in :mod:`grader.labs` (notebooks 04, 04b, 07 introduce them);
``grader check`` and ``grader grade`` call the same :func:`run_lab`. A lab's checks and results are the
assignment's vocabulary (:class:`~grader.results.Check`, :class:`~grader.results.CheckResult`,
:class:`~grader.results.LabResult`), and :func:`grader.render.lab_feedback` prints them.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course.runtime.launch import RankFailed, RankTimeout, launch
from grader.labs import variant
from grader.labs.shortcuts import REFUSED, Refused, guarded, uses
from grader.results import Check, CheckResult, LabResult


@dataclass(frozen=True)
class Finding:
    """What one rank (or the driver) found about one check; ``message`` says it in the learner's terms."""

    check: str  # a Check.name ("*": every check)
    passed: bool
    message: str = ""


@dataclass(frozen=True)
class RankFindings:
    """What a rank_check may return instead of a plain list of findings: findings plus evidence for the driver."""

    findings: list[Finding]
    evidence: dict[str, Any] = field(default_factory=dict)  # picklable (tensors, numbers), read by cross_check


@dataclass(frozen=True)
class Lab:
    """A lab: what the student writes, where, and how it is checked (see ``docs/contributing.md``, "Adding a lab")."""

    name: str  # "ring", "ddp", "zero", ...
    title: str
    notebook: str  # the notebook that introduces it, e.g. "04_allreduce"
    student_file: str  # relative to notebooks/, e.g. "labs/ring_allreduce.py"
    entry: str  # the function (or class) the student writes
    checks: tuple[Check, ...]
    rank_check: Callable[[str, dict], Any]  # called as rank_check(path, config) on every rank of a run
    runs: tuple[dict, ...]  # visible runs: each {"world_size": 4, "label": "what this run tries", ...config}
    hidden_runs: tuple[dict, ...] = ()  # grader only (more sizes, other world sizes, a jittered seed)
    #: called outside the ranks as cross_check(config, evidence_by_rank) -> list[Finding]
    cross_check: Callable[[dict, list[dict]], list[Finding]] | None = None
    hang_hint: str = ""  # what usually makes this lab hang, appended to a timeout's message
    #: "module:name" of ready-made versions of what the student writes (the course's own, torch's): a file that
    #: uses one is refused, every check failing with a message that names it (see grader.labs.shortcuts)
    shortcuts: tuple[str, ...] = ()
    #: config key of ``runs[0]`` -> the values it may take: each student's first visible run draws its own from
    #: their id (see grader.labs.variant); ``runs[0]`` itself is the published default
    variant: Mapping[str, tuple] = field(default_factory=dict)


NOT_ATTEMPTED = ("Not attempted yet: your {entry} still raises NotImplementedError. Replace the raise in "
                 "{path} with your code, then run this check again.")


def load_entry(path: str, entry: str) -> Any:
    """In a rank: import the student's file and return its ``entry``; raises :class:`StudentError` if it cannot."""
    if not os.path.isfile(path):
        raise StudentError(f"{path} does not exist: run the lab's %%writefile cell first (it creates the file), "
                           "or pass the path of your file.")
    spec = importlib.util.spec_from_file_location(f"student_lab_{os.getpid()}", os.path.abspath(path))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[module.__name__] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    if not hasattr(module, entry):
        raise StudentError(f"{path} defines no {entry}: the lab calls {entry}, keep that name.")
    return getattr(module, entry)


class StudentError(Exception):
    """Something about the student's file (missing, no entry) that the checker explains as it is."""


def _student_line(error: BaseException, path: str) -> int | None:
    """The line of the student's file where ``error`` was raised (its innermost frame in that file)."""
    target = os.path.abspath(path)
    if isinstance(error, SyntaxError) and error.filename and os.path.abspath(error.filename) == target:
        return error.lineno
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == target]
    return frames[-1].lineno if frames else None


def describe_error(error: BaseException, path: str, entry: str, rank: int) -> str:
    """A rank's exception in the learner's terms: whose code raised what, and where."""
    if isinstance(error, NotImplementedError) and _student_line(error, path) is not None:
        return NOT_ATTEMPTED.format(entry=entry, path=path)
    if isinstance(error, (StudentError, Refused)):
        return str(error)
    line = _student_line(error, path)
    text = f"{type(error).__name__}: {error}".strip().rstrip(":")
    if line is None:
        last = traceback.extract_tb(error.__traceback__)[-1:] or None
        where = f" in {os.path.basename(last[0].filename)}" if last else ""
        return (f"the checker failed on rank {rank} with {text}{where}: this is a bug in the course, not in your "
                "code; please report it with your file.")
    return f"your {entry} raised {text} on rank {rank} (line {line} of {path})"


def on_rank(rank_check: Callable[[str, dict], Any], path: str, entry: str, config: dict, notes_dir: str,
            shortcuts: tuple[str, ...] = ()) -> Any:
    """Launched on every rank: run the lab's rank_check; an exception is explained in a file, then re-raised.

    Meanwhile a call from the student's file to one of the lab's ``shortcuts`` raises :class:`Refused`."""
    from course import world

    try:
        with guarded(path, shortcuts, lambda name: REFUSED.format(name=name, entry=entry)):
            return rank_check(path, config)
    except BaseException as error:  # noqa: B036 - every way the student's code can end must be explained
        rank = world.current().rank
        message = describe_error(error, path, entry, rank)
        with open(os.path.join(notes_dir, f"rank-{rank}.json"), "w") as handle:
            json.dump({"message": message, "not_attempted": message.startswith("Not attempted"),
                       "cause": isinstance(error, (StudentError, Refused))}, handle)
        raise


def _label(config: dict) -> str:
    """``"world_size=4, 1001 float32 elements"``: the prefix of every message from this run (a label may name
    the run's keys, ``"{steps} SGD steps"``, so that a student's variant reads with its own numbers)."""
    label = str(config.get("label", "")).format_map(config)
    return f"world_size={config['world_size']}" + (f", {label}" if label else "")


def _run_once(lab: Lab, path: str, config: dict) -> tuple[list[Finding], bool]:
    """One run: findings from every rank (cross-checked ones first), and whether to stop here (the stub is still
    in place, or the run hung); a message that stops the run carries its own prefix, if any."""
    notes_dir = tempfile.mkdtemp(prefix="course-lab-")
    try:
        per_rank = launch(on_rank, config["world_size"], lab.rank_check, path, lab.entry, config, notes_dir,
                          lab.shortcuts, timeout_s=config.get("timeout_s", 60.0))
    except RankFailed as failure:
        return [Finding("*", False, _failure_message(failure, notes_dir))], _not_attempted(notes_dir)
    except RankTimeout as timeout:  # no point waiting as long again in the next run: stop (as for the stub)
        hint = f" {lab.hang_hint}" if lab.hang_hint else ""
        return [Finding("*", False, f"{_label(config)}: your {lab.entry} did not finish: {timeout}{hint}")], True
    finally:
        shutil.rmtree(notes_dir, ignore_errors=True)
    ranks = [r if isinstance(r, RankFindings) else RankFindings(list(r)) for r in per_rank]
    findings = lab.cross_check(config, [r.evidence for r in ranks]) if lab.cross_check else []
    return list(findings) + [f for r in ranks for f in r.findings], False


def _failure_message(failure: RankFailed, notes_dir: str) -> str:
    """The explained exception of the failed rank, or how it died when it could not explain itself; a rank that
    named the cause (a refusal, a mismatch the lab found) first, since the others then fail as a consequence."""
    for name in sorted(os.listdir(notes_dir)):
        with open(os.path.join(notes_dir, name)) as handle:
            note = json.load(handle)
        if note.get("cause"):
            return note["message"]
    explained = os.path.join(notes_dir, f"rank-{failure.rank}.json")
    if os.path.exists(explained):
        with open(explained) as handle:
            return json.load(handle)["message"]
    last = failure.remote_traceback.strip().splitlines()[:1] or ["no output"]
    return f"rank {failure.rank} died without a Python exception: {last[0]}"


def _not_attempted(notes_dir: str) -> bool:
    """True if a rank found the stub still in place (no point running the other runs)."""
    for name in os.listdir(notes_dir):
        with open(os.path.join(notes_dir, name)) as handle:
            if json.load(handle).get("not_attempted"):
                return True
    return False


def folder(lab: Lab) -> Path:
    """The lab's folder, ``grader/labs/<lab>/``: its check, its stub and its reference solution."""
    return Path(inspect.getfile(lab.rank_check)).parent


def stub_path(lab: Lab) -> Path:
    """The stub a student starts from: ``grader/labs/<lab>/stub.py``."""
    return folder(lab) / "stub.py"


def reference_path(lab: Lab) -> Path:
    """The lab's reference solution, for after the student tried: ``grader/labs/<lab>/reference.py``."""
    return folder(lab) / "reference.py"


def _is_the_stub(lab: Lab, path: str) -> bool:
    """True if ``path`` is still the packaged stub, byte for byte (nothing written yet)."""
    stub = stub_path(lab)
    return os.path.isfile(path) and stub.is_file() and Path(path).read_bytes() == stub.read_bytes()


def run_lab(lab: Lab, path: str, hidden: bool = False, student_ids: tuple[str, ...] = ()) -> LabResult:
    """Run every run of ``lab`` on the student's file ``path`` and merge the findings into a :class:`LabResult`.

    Args:
        lab: the lab (see :mod:`grader.labs`).
        path: the student's file, e.g. ``"labs/ring_allreduce.py"`` (relative to the current directory).
        hidden: also the hidden runs and hidden checks (the grader's ``grade``; never the self-check).
        student_ids: who the grader knows the file is from (every spelling of one id); empty in the self-check,
            where the file's ``STUDENT_ID`` picks the variant (:func:`grader.labs.variant.whose`).
    """
    checks = [check for check in lab.checks if hidden or not check.hidden]
    student_id, notes = variant.whose(path, student_ids) if lab.variant else ("", ())
    mine = f"{'your' if student_id else 'the published'} variant: {variant.describe(lab, student_id)}" \
        if lab.variant else ""
    if _is_the_stub(lab, path):  # every check would fail the same way: say so without starting any rank
        message = NOT_ATTEMPTED.format(entry=lab.entry, path=path)
        return LabResult(lab.name, lab.title, path, tuple(CheckResult.of(check, False, message) for check in checks),
                         0.0, 0, hidden, variant=mine, notes=notes)
    if used := uses(path, lab.shortcuts):  # refused as the stub is: no rank needs to start to say so
        message = REFUSED.format(name=" and ".join(used), entry=lab.entry)
        return LabResult(lab.name, lab.title, path, tuple(CheckResult.of(check, False, message) for check in checks),
                         0.0, 0, hidden, variant=mine, notes=notes)
    first_failure: dict[str, str] = {}
    measures: dict[str, str] = {}  # the first passing message of each check that shows_measure
    shown = {check.name for check in checks if check.shows_measure}
    seen: set[str] = set()
    start, runs = time.monotonic(), 0
    for config in variant.variant_runs(lab, student_id) + (lab.hidden_runs if hidden else ()):
        runs += 1
        if config.get("seed") == "jitter":  # a new seed at every grading: no answer can be learned by heart
            config = {**config, "seed": random.randrange(2**31)}
        findings, stop = _run_once(lab, path, config)
        for finding in findings:
            ids = [check.name for check in checks] if finding.check == "*" else [finding.check]
            seen.update(ids)
            for check_id in ids:
                if not finding.passed and check_id not in first_failure:
                    first_failure[check_id] = finding.message if stop else f"{_label(config)}: {finding.message}"
                elif finding.passed and finding.message and check_id in shown:
                    measures.setdefault(check_id, f"{_label(config)}: {finding.message}")
        if stop:
            break
    unchecked = "not checked: no run reported on it"
    results = tuple(CheckResult.of(check, check.name in seen and check.name not in first_failure,
                                   first_failure.get(check.name, measures.get(check.name, "" if check.name in seen
                                                                              else unchecked)))
                    for check in checks)
    return LabResult(lab.name, lab.title, path, results, time.monotonic() - start, runs, hidden, variant=mine,
                     notes=notes)
