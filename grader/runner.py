"""Grade one submission: check the file, run it on 4 ranks in the sandbox, collect evidence, run the checks.

    results = grade(Path("train_4gpu.py"))          # a Results object; nothing printed, nothing rendered
    results.save(Path("results.json"))              # raw; grader.reports renders CSV, Gradescope, feedback

The run: a fresh directory holding only the submission (as ``train_4gpu.py``); a fresh key; ``python -m
grader.launcher`` inside :func:`grader.sandbox.run` (own session and uid, wall/memory/process/file/CPU
limits, loopback only) starting 4 ranks with torchrun's environment; the probes' signed records read
from an inherited pipe; the checkpoint evaluated by :mod:`grader.evaluate` in a second sandboxed
process. A result is always returned, with a status. Used by the grader of notebook 06.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from course import data, world
from course.runtime import outcome
from grader import channel, crashes, sandbox
from grader import secret as instructor_secret
from grader.assignment import ASSIGNMENT, Assignment
from grader.checks import CHECKS
from grader.evidence import Evidence, bind_checkpoint, collect, replay_first_steps
from grader.harness import KEY_FD_ENV, RECORD_FD_ENV, SEED_ENV, probe_seed
from grader.results import CheckResult, Results

ROOT = Path(__file__).resolve().parent.parent  # holds the grader and course packages
STARTER = ROOT / "notebooks" / "assignment" / "train_1gpu.py"
SKELETON = ROOT / "notebooks" / "assignment" / "train_4gpu_skeleton.py"
BAD = "bad submission"
INTERRUPTED = "interrupted"  # the grader was stopped during the run: no verdict on the submission


@dataclass(frozen=True)
class GradingConfig:
    """How to grade."""

    assignment: Assignment = ASSIGNMENT
    limits: sandbox.Limits = field(default_factory=lambda: sandbox.Limits(wall_s=180.0))  # the 4-rank run
    eval_limits: sandbox.Limits = field(default_factory=lambda: sandbox.Limits(wall_s=60.0, cpu_s=60))
    straggler_s: float = 20.0  # after one rank finishes, how long the others may take before they count as hung
    visible_only: bool = False  # True for the student's self-check
    isolation: str = "auto"  # sandbox.run's isolation ("process-tree" skips the root-only containment)
    # set it to stop every run graded with this config at once (the grader got SIGTERM): status "interrupted"
    stop: threading.Event | None = field(default=None, compare=False, repr=False)


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
        raise BadSubmission(f"this is the unchanged skeleton ({SKELETON.name}): nothing was converted yet. Do its "
                            "TODOs (notebook 06 walks you through them, notebook 05 has each piece), then submit.")
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


def submission_seed(script: Path) -> int:
    """The evaluation seed: from the submission's content, so the student cannot pick it and regrading agrees.

    Mixed with the instructor's secret (:func:`grader.secret.load`: made at random on first use and kept in
    the grader's configuration), so that a student who has the grader cannot compute it.
    """
    secret = instructor_secret.load()
    digest = hashlib.sha256(b"multigpu-course grader\0" + secret + b"\0" + script.read_bytes()).digest()
    return int.from_bytes(digest[:4], "big")


def _env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
    for name in (world.EMULATE_ENV, "CUDA_VISIBLE_DEVICES"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _python() -> list[str]:
    # -P: the run directory (which the student's code can write) is not searched for grader modules
    return [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]


def grade(submission: Path, config: GradingConfig = GradingConfig()) -> Results:
    """Grade one submission (a script, or a folder holding it); always returns Results, never raises for it."""
    start = time.monotonic()
    name = Path(submission).name
    try:
        script = find_script(Path(submission), config.assignment)
    except BadSubmission as error:
        return not_run(name, BAD, str(error), config, start)
    seed = submission_seed(script)
    # the grader's own work overlaps the sandboxed processes: the evaluation process starts with the run
    # (its interpreter and torch load meanwhile), and the single-process replay runs while it evaluates
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp, ThreadPoolExecutor(2) as helper:
        evaluation = _Evaluation(Path(tmp) / "evaluate", seed, config, helper)
        try:
            run_dir = Path(tmp) / "run"
            run_dir.mkdir()
            shutil.copyfile(script, run_dir / config.assignment.script_name)
            evidence, result, extra = _run(run_dir, seed, config)
            evidence.status, detail = _status(evidence, result, config)
            if evidence.status == INTERRUPTED:  # nothing to conclude about the submission: no check is run
                return not_run(name, INTERRUPTED, detail, config, start, output=extra)
            replay = helper.submit(replay_first_steps, evidence)  # fills evidence.comparisons/replay_error only
            checkpoint = run_dir / config.assignment.checkpoint
            if checkpoint.is_file():
                _evaluate(checkpoint, evaluation, evidence)
            else:
                evidence.checkpoint_error = (f"no checkpoint at {config.assignment.checkpoint}: save "
                                             "model.state_dict() there on rank 0 after training.")
            replay.result()
        finally:
            evaluation.cancel()  # without a checkpoint, the waiting evaluation process just exits
    results = Results(name, evidence.status, detail, seed=seed, test_accuracy=evidence.test_accuracy,
                      output=extra)
    return _finish(results, evidence, config, start)


_SPLITS: list[data.Splits] = []
_SPLITS_LOCK = threading.Lock()


def _splits() -> data.Splits:
    """The course data, loaded once per grader process and shared by its threads (it never changes)."""
    with _SPLITS_LOCK:
        if not _SPLITS:
            _SPLITS.append(data.load())
        return _SPLITS[0]


def _run(run_dir: Path, seed: int, config: GradingConfig) -> tuple[Evidence, sandbox.SandboxResult, str]:
    key = channel.new_key()
    record_r, record_w = os.pipe()
    key_fd = channel.key_pipe(key)
    reader = channel.Reader(os.fdopen(record_r, "rb"), key)
    env = {**_env(), KEY_FD_ENV: str(key_fd), RECORD_FD_ENV: str(record_w), SEED_ENV: str(probe_seed(seed))}
    argv = [*_python(), "-m", "grader.launcher", "--nproc", str(config.assignment.world_size),
            "--straggler-s", str(config.straggler_s), config.assignment.script_name]
    try:
        result = sandbox.run(argv, cwd=run_dir, env=env, limits=config.limits, pass_fds=(key_fd, record_w),
                             isolation=config.isolation, stop=config.stop,
                             hide=(str(instructor_secret.secret_path()),))
    finally:
        os.close(record_w)
        os.close(key_fd)
    records = reader.result()
    evidence = collect(records, config.assignment.world_size, world.detect_hardware().backend)
    evidence.rejected_records = reader.rejected
    evidence.train_size = len(_splits().train)
    return evidence, result, _output(evidence, result)


def _output(evidence: Evidence, result: sandbox.SandboxResult) -> str:
    parts = []
    if 0 in evidence.exits:
        shown, printed = evidence.exits[0]["stdout"][:2000], evidence.exits[0]["stdout_bytes"]
        if printed > len(shown.encode()):
            shown += f"\n[... rank 0 printed {printed} bytes in all; only the first are shown]"
        parts.append("--- rank 0 output ---\n" + shown)
    failed = crashes.failed_ranks(evidence)
    if failed:  # the first failing rank's own errors, not a peer's echo of them
        rank = crashes.first_failure(evidence, failed).rank
        parts.append(f"--- rank {rank} errors (tail) ---\n" + crashes.trimmed_stderr(evidence.exits[rank]["stderr"]))
    if not evidence.exits:
        parts.append("--- output ---\n" + result.stdout[:2000] + "\n" + result.stderr[-3000:])
    return "\n".join(parts)


_RAN_OUT = {"out of memory": "rank {rank} ran out of memory: keep per-rank batches small.",
            "too many processes": "rank {rank} could not start more processes or threads."}


def _status(ev: Evidence, result: sandbox.SandboxResult, config: GradingConfig) -> tuple[str, str]:
    """How the run ended, naming ranks: from the sandbox's verdict, the launcher's and the probes' records."""
    if result.status == "timeout":
        unfinished = [r for r in ev.ranks if not ev.ends.get(r)]
        if 0 < len(unfinished) < ev.world_size:
            return _hang(ev, unfinished)
        waiting = [r for r in ev.ranks if ev.last_record.get(r, {}).get("kind") == "collective"]
        if 0 < len(waiting) < ev.world_size:
            return _hang(ev, [r for r in ev.ranks if r not in waiting])
        return "timeout", result.detail
    if result.status not in ("ok", "error"):
        return result.status, result.detail
    if len(ev.exits) < ev.world_size and result.returncode is not None and result.returncode < 0:
        return "error", _launcher_killed(ev, -result.returncode)
    hung = [r for r, e in sorted(ev.exits.items()) if e.get("stopped") == "hang"]
    if hung:
        return _hang(ev, hung)
    failed = crashes.failed_ranks(ev)
    torn_down = [r for r, e in sorted(ev.exits.items()) if e["returncode"] != 0 and not e.get("stopped")
                 and r not in failed]
    if failed:  # the cause is a memory or process error anywhere, else the rank that failed first
        for rank in failed:
            resource = outcome.resource_error(ev.exits[rank]["stderr"])
            if resource:
                return resource, _RAN_OUT[resource].format(rank=rank)
        failure = crashes.first_failure(ev, failed)
        return failure.status, failure.detail
    if len(ev.exits) < ev.world_size:
        return "error", f"the ranks could not be started: {result.detail} {result.stderr[-500:]}"
    if torn_down:  # after the script itself had finished: not the student's doing, and not repeatable
        return "ok", (f"all ranks finished; rank(s) {', '.join(map(str, torn_down))} then aborted while the "
                      "interpreter shut down (torch teardown), which is not counted")
    return "ok", "all ranks finished"


def _launcher_killed(ev: Evidence, signum: int) -> str:
    """The launcher (the ranks' parent) was killed by ``signum`` before it could report: its records are lost."""
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
    started = sorted(r for r in ev.ranks if ev.last_record.get(r))
    seen = f" (the probes had heard from rank(s) {', '.join(map(str, started))})" if started else ""
    return (f"the grader's launcher, which starts the ranks and keeps their output, was killed by {name} from "
            f"outside the grader before the ranks ended{seen}, "
            "so their exit codes and output are lost. A rank that signals its parent process, the kernel's "
            "out-of-memory killer or someone on this machine did it; grade it again to tell which.")


def _hang(ev: Evidence, ranks: list[int]) -> tuple[str, str]:
    """``hang on rank k``: ``ranks`` never got where the others did; say which collective the others wait in."""
    waiting = [f"rank {r} waits in {ev.last_record[r]['op']}() (its collective #{ev.last_record[r]['seq']})"
               for r in ev.ranks if ev.last_record.get(r, {}).get("kind") == "collective"]
    names = ", ".join(str(r) for r in ranks)
    detail = (f"rank(s) {names} never got to where the other ranks were, and the run was stopped. "
              + ("; ".join(waiting) + ". " if waiting else "")
              + "Every rank must reach every collective, in the same order.")
    return f"hang on rank {names}", detail


GO_FD_ENV = "GRADER_GO_FD"
# python -c of the evaluation process: import the evaluator (torch) at once, then wait for the grader's go
_EVALUATE_WHEN_TOLD = (f"import os, sys\nimport grader.evaluate as evaluate\n"
                       f"go = os.read(int(os.environ.pop({GO_FD_ENV!r})), 1)\n"
                       f"sys.exit(evaluate.main(sys.argv[1:]) if go == b'g' else 0)")


class _Evaluation:
    """The checkpoint's evaluation: :mod:`grader.evaluate` in its own clean sandbox, started with the run so
    that its start-up (interpreter, torch) overlaps the run. It waits until :meth:`give` has put the
    checkpoint in its directory, next to the grader's test data; :meth:`cancel` lets it exit unused."""

    def __init__(self, folder: Path, seed: int, config: GradingConfig, pool: ThreadPoolExecutor) -> None:
        self.folder = folder
        folder.mkdir()
        self._go_r, self._go_w = os.pipe()
        self._future = pool.submit(self._run, seed, config)

    def _run(self, seed: int, config: GradingConfig) -> sandbox.SandboxResult:
        try:
            splits = _splits()
            images, labels = splits.test.tensors
            torch.save({"images": images, "labels": labels, "val_images": splits.val.tensors[0],
                        "val_labels": splits.val.tensors[1]}, self.folder / "test.pt")  # no data to load there
            argv = [*_python(), "-c", _EVALUATE_WHEN_TOLD, "checkpoint.pt", "--seed", str(seed),
                    "--test-data", "test.pt"]
            limits = replace(config.eval_limits, wall_s=config.limits.wall_s + config.eval_limits.wall_s)
            return sandbox.run(argv, cwd=self.folder, env={**_env(), GO_FD_ENV: str(self._go_r)}, limits=limits,
                               pass_fds=(self._go_r,), isolation=config.isolation)
        finally:
            os.close(self._go_r)

    def give(self, checkpoint: Path) -> sandbox.SandboxResult:
        """Copy ``checkpoint`` in, let the evaluation go, and return how its process ended."""
        shutil.copyfile(checkpoint, self.folder / "checkpoint.pt")
        self._signal(b"g")
        return self._future.result()

    def cancel(self) -> None:
        self._signal(b"")

    def _signal(self, go: bytes) -> None:
        if self._go_w is None:
            return
        with contextlib.suppress(OSError):  # the process already ended: give() reports how
            os.write(self._go_w, go)
        os.close(self._go_w)
        self._go_w = None


def _evaluate(checkpoint: Path, evaluation: _Evaluation, ev: Evidence) -> None:
    """The grader's own test accuracy of the checkpoint, from the clean sandboxed evaluation process, kept only
    if the checkpoint holds parameters rank 0's optimizer produced (:func:`grader.evidence.bind_checkpoint`)."""
    result = evaluation.give(checkpoint)
    try:
        verdict = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        ev.checkpoint_error = f"the checkpoint could not be evaluated ({result.status}: {result.detail})."
        return
    ev.checkpoint_error = verdict.get("error")
    if ev.checkpoint_error is None and bind_checkpoint(ev, verdict.get("digests"), checkpoint.name):
        ev.test_accuracy = verdict.get("accuracy")
        ev.checkpoint_val_accuracy, ev.checkpoint_fingerprint = verdict.get("val_accuracy"), verdict.get("fingerprint")


def not_run(name: str, status: str, detail: str, config: GradingConfig = GradingConfig(),
            start: float | None = None, output: str = "") -> Results:
    """Results for a submission that was not run, or not to the end (``bad submission``, ``grader error``,
    ``interrupted``): every check of the rubric listed as not run, with 0 points of its full ``max_score``, so
    the gradebook's totals stay right. The reason is ``detail``, said once (not repeated in every check);
    ``output`` is what the run printed before it was stopped, if it ran."""
    return _finish(Results(name, status, detail, output=output), None, config,
                   time.monotonic() if start is None else start)


def _finish(results: Results, evidence: Evidence | None, config: GradingConfig, start: float) -> Results:
    for check in CHECKS:
        if config.visible_only and check.visibility != "visible":
            continue
        if evidence is None:
            results.checks.append(CheckResult(check.name, check.title, 0.0, check.points, check.visibility, False,
                                              f"not run ({results.status}: see above).", ran=False,
                                              voids_score=check.voids_score))
            continue
        try:
            passed, message = check.test(evidence, config.assignment)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as error:
            passed, message = False, f"the records did not allow this check ({type(error).__name__}: {error})."
        results.checks.append(CheckResult(check.name, check.title, check.points if passed else 0.0,
                                          check.points, check.visibility, passed, message,
                                          voids_score=check.voids_score))
    results.elapsed_s = time.monotonic() - start
    return results
