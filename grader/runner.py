"""Grade one submission: check the file, run it on 4 ranks in the sandbox, collect evidence, run the checks.

    results = grade(Path("train_4gpu.py"))          # a Results object; nothing printed, nothing rendered
    results.save(Path("results.json"))              # raw; grader.render renders CSV, Gradescope, feedback

The run: a fresh directory holding only the submission (as ``train_4gpu.py``); a fresh key; ``python -m
grader.inrank.launcher`` inside :func:`grader.sandbox.run` (own session and uid, wall/memory/process/file/CPU
limits, loopback only) starting 4 ranks with torchrun's environment; the probes' signed records read
from an inherited pipe; the checkpoint evaluated by :mod:`grader.evaluate` in a second sandboxed
process. A result is always returned, with a status.

:func:`grade` composes the grader's jobs, each in its own module: which script (:mod:`grader.submission`),
its evaluation seed (:func:`grader.secret.submission_seed`), the processes' environment
(:mod:`grader.environment`), the sandboxed run and how it ended (here: ``_run``, ``_status``), the run's
evidence (:mod:`grader.evidence`, from the typed records of :mod:`grader.inrank.records`) and the rubric
(:mod:`grader.rubric`, :mod:`grader.checks`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from course import data, world
from course.runtime import outcome, progress, waits
from course.runtime.pace import Pace, machine_pace
from grader import crashes, moved, rubric, sandbox
from grader import secret as instructor_secret
from grader.assignment import ASSIGNMENT, Assignment
from grader.environment import python_argv, run_env
from grader.evidence import Checkpoint, Evidence, RunRecords, collect, judge_checkpoint, replay_first_steps
from grader.inrank import channel
from grader.inrank.harness import KEY_FD_ENV, RECORD_FD_ENV, SEED_ENV, probe_seed
from grader.results import BAD, FINISHED, Results
from grader.secret import submission_seed
from grader.submission import BadSubmission, find_script

GRADER_STOPPED = "interrupted"  # the grader was stopped during the run: no verdict on the submission
GRADER_ERROR = "grader error"  # the grader's own code failed (grader.gradebook retries these)
MISSING_LIBRARY = "missing library"  # the script imports what the grading environment does not have
MISSING_NAME = "missing name"  # the script imports a course module or name that does not exist (grader.moved)
COMPILED = "torch.compile ran without compiling in the grader; the grade does not depend on it."


@dataclass(frozen=True)
class GradingConfig:
    """How to grade."""

    assignment: Assignment = ASSIGNMENT
    # the 4-rank run; files up to the sandbox's 64 MiB (it was 256 for torch.compile's C++ compiler, which writes a
    # 150 MiB header and no longer runs: torch.compile runs without compiling, grader.environment.COMPILE_OFF)
    limits: sandbox.Limits = field(default_factory=lambda: sandbox.Limits(wall_s=180.0))
    eval_limits: sandbox.Limits = field(default_factory=lambda: sandbox.Limits(wall_s=60.0, cpu_s=60))
    # seconds with no progress by every rank still running (no CPU time, no record, no output) before they are
    # stopped as hung; a rank that is behind but working is waited for, up to limits.wall_s
    idle_s: float = progress.WINDOW_S
    # the machine's pace: the wall limits above are for a quiet reference machine, and grow on a slower or busier
    # one (course.runtime.pace); None: measured once per grader process
    pace: Pace | None = None
    visible_only: bool = False  # True for the student's self-check
    isolation: str = "auto"  # sandbox.run's isolation ("process-tree" skips the root-only containment)
    # set it to stop every run graded with this config at once (the grader got SIGTERM): status "interrupted"
    stop: threading.Event | None = field(default=None, compare=False, repr=False)


def grade(submission: Path, config: GradingConfig = GradingConfig()) -> Results:
    """Grade one submission (a script, or a folder holding it); always returns Results, never raises for it."""
    start = time.monotonic()
    name = Path(submission).name
    try:
        script = find_script(Path(submission), config.assignment)
    except BadSubmission as error:
        return not_run(name, BAD, str(error), config, start)
    seed = submission_seed(script)
    config = replace(config, pace=config.pace or machine_pace())
    # the grader's own work overlaps the sandboxed processes: the evaluation process starts with the run
    # (its interpreter and torch load meanwhile), and the single-process replay runs while it evaluates
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp, ThreadPoolExecutor(2) as helper:
        evaluation = _Evaluation(Path(tmp) / "evaluate", seed, config, helper)
        try:
            run_dir = Path(tmp) / "run"
            run_dir.mkdir()
            shutil.copyfile(script, run_dir / config.assignment.script_name)
            records, result, extra = _run(run_dir, seed, config)
            status, detail = _status(records, result, config)
            if status in (GRADER_STOPPED, GRADER_ERROR, MISSING_LIBRARY, MISSING_NAME):  # nothing ran: no check is run
                return not_run(name, status, detail, config, start, output=extra)
            replay = helper.submit(replay_first_steps, records)
            checkpoint = _checkpoint(run_dir, evaluation, records, config)
            backend = world.detect_hardware().backend_for(config.assignment.world_size)  # gloo when ranks > GPUs
            evidence = Evidence.of(records, expected_backend=backend, status=status,
                                   train_size=len(_splits().train), checkpoint=checkpoint, replay=replay.result())
        finally:
            evaluation.cancel()  # without a checkpoint, the waiting evaluation process just exits
    results = Results(name, status, detail, seed=seed, test_accuracy=evidence.test_accuracy, output=extra)
    return rubric.apply(results, evidence, config.assignment, config.visible_only, start)


_SPLITS: list[data.Splits] = []
_SPLITS_LOCK = threading.Lock()


def _splits() -> data.Splits:
    """The course data, loaded once per grader process and shared by its threads (it never changes)."""
    with _SPLITS_LOCK:
        if not _SPLITS:
            _SPLITS.append(data.load())
        return _SPLITS[0]


def _run(run_dir: Path, seed: int, config: GradingConfig) -> tuple[RunRecords, sandbox.SandboxResult, str]:
    key = channel.new_key()
    record_r, record_w = os.pipe()
    key_fd = channel.key_pipe(key)
    reader = channel.Reader(os.fdopen(record_r, "rb"), key)
    env = {**run_env(), KEY_FD_ENV: str(key_fd), RECORD_FD_ENV: str(record_w), SEED_ENV: str(probe_seed(seed))}
    argv = [*python_argv(), "-m", "grader.inrank.launcher", "--nproc", str(config.assignment.world_size),
            "--idle-s", str(config.idle_s), config.assignment.script_name]
    try:
        result = sandbox.run(argv, cwd=run_dir, env=env, limits=_paced(config.limits, config),
                             pass_fds=(key_fd, record_w),
                             isolation=config.isolation, stop=config.stop,
                             hide=(str(instructor_secret.secret_path()),))
    finally:
        os.close(record_w)
        os.close(key_fd)
    records = collect(reader.result(), config.assignment.world_size, rejected_records=reader.rejected)
    return records, result, _output(records, result)


def _output(records: RunRecords, result: sandbox.SandboxResult) -> str:
    """What the student sees of the run's output: rank 0's, and the first failing rank's errors."""
    parts = []
    if 0 in records.exits:
        shown, printed = records.exits[0].stdout[:2000], records.exits[0].stdout_bytes
        if printed > len(shown.encode()):
            shown += f"\n[... rank 0 printed {printed} bytes in all; only the first are shown]"
        parts.append("--- rank 0 output ---\n" + shown)
    failed = crashes.failed_ranks(records)
    if failed:  # the first failing rank's own errors, not a peer's echo of them
        rank = crashes.first_failure(records, failed).rank
        parts.append(f"--- rank {rank} errors (tail) ---\n" + crashes.trimmed_stderr(records.exits[rank].stderr))
    if not records.exits:
        parts.append("--- output ---\n" + result.stdout[:2000] + "\n" + result.stderr[-3000:])
    return "\n".join(parts)


def _paced(limits: sandbox.Limits, config: GradingConfig) -> sandbox.Limits:
    """``limits`` with its wall-clock limit scaled to the machine's pace (:mod:`course.runtime.pace`)."""
    return replace(limits, wall_s=_pace(config).limit(limits.wall_s))


def _pace(config: GradingConfig) -> Pace:
    return config.pace or Pace(1.0)


_RAN_OUT = {"out of memory": "rank {rank} ran out of memory: keep per-rank batches small.",
            "too many processes": "rank {rank} could not start more processes or threads."}


def _status(ev: Evidence, result: sandbox.SandboxResult, config: GradingConfig) -> tuple[str, str]:
    """How the run ended, naming ranks (and the processes the ranks spawned, if they did), or that the grader's
    own probes failed (then the run says nothing of the submission)."""
    failure = _probe_failure(ev)
    if failure:
        return failure
    status, detail = _ended(ev, result, config)
    if status == GRADER_STOPPED:
        return status, detail
    detail = ("" if status == "ok" else _spawned(ev)) + detail
    return status, f"{detail.rstrip('.')}. {COMPILED}" if _compiled(ev, status) else detail


def _ended(ev: Evidence, result: sandbox.SandboxResult, config: GradingConfig) -> tuple[str, str]:
    """How the run ended, naming ranks: from the sandbox's verdict, the launcher's and the probes' records."""
    if result.status == "timeout":
        return "timeout", _still_working(ev, config)
    if result.status not in ("ok", "error"):
        return result.status, result.detail
    if len(ev.exits) < ev.world_size and result.returncode is not None and result.returncode < 0:
        return "error", _launcher_killed(ev, -result.returncode)
    hung = [r for r, e in sorted(ev.exits.items()) if e.get("stopped") == "hang"]
    if hung:
        return _hang(ev, hung, config.idle_s)
    failed = crashes.failed_ranks(ev)
    torn_down = [r for r, e in sorted(ev.exits.items()) if e["returncode"] != 0 and not e.get("stopped")
                 and r not in failed]
    if failed:  # the cause is a grader's limit or a missing library, else the rank that failed first
        limited = _limit_or_library(ev, failed, config)
        if limited:
            return limited
        for rank in failed:
            resource = outcome.resource_error(ev.exits[rank]["stderr"])
            if resource:
                return resource, _RAN_OUT[resource].format(rank=rank)
        failure = crashes.first_failure(ev, failed)
        return failure.status, failure.detail
    if len(ev.exits) < ev.world_size:
        return "error", f"the ranks could not be started: {result.detail} {result.stderr[-500:]}"
    if torn_down:  # after the script itself had finished: not the student's doing, and not repeatable
        return "ok", (f"{FINISHED}; rank(s) {', '.join(map(str, torn_down))} then aborted while the "
                      "interpreter shut down (torch teardown), which is not counted")
    return "ok", FINISHED


def _limit_or_library(ev: Evidence, failed: list[int], config: GradingConfig) -> tuple[str, str] | None:
    """A failure that is the grading environment's doing, said first and in one line: a sandbox limit (named as
    the grader's) or a library the grading environment does not have."""
    for rank in failed:
        text = crashes.error_text(ev, rank) + ev.exits[rank].stderr
        if where := moved.explain(text):  # the course is there: the name is not (renamed, or moved)
            return MISSING_NAME, f"rank {rank} could not import from the course: {where}"
        library = crashes.missing_library(text)
        if library:
            return MISSING_LIBRARY, (f"this library is not available in the grading environment: {library} "
                                       f"(rank {rank}: No module named '{library}'); the assignment needs only "
                                       "torch and the course.")
    for rank in failed:
        if crashes.over_file_limit(ev, rank):
            compiled = any(c.function == "torch.compile" for c in ev.calls.get(rank, ()))
            who = "torch.compile's C++ compiler" if compiled else "a process"
            return "file too large", (
                f"the grader's limit stopped rank {rank}: {who} wrote a file larger than the grader allows "
                f"({outcome.size(config.limits.file_size_bytes)} per file).")
    return None


def _spawned(ev: Evidence) -> str:
    """What the ranks started themselves with torch.multiprocessing (one sentence), or ''."""
    spawned = {r: c.nprocs for r in ev.ranks for c in ev.calls.get(r, ()) if "multiprocessing" in c.function}
    if not spawned:
        return ""
    counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(spawned.items()))
    total = ev.world_size + sum(n or 0 for n in spawned.values())
    return (f"Under torchrun every rank is already one training process, and the ranks started more with "
            f"torch.multiprocessing.spawn ({counts}): {total} processes in all, the spawned ones claiming ranks "
            "torchrun already gave. Call the training function directly; torchrun does the spawning. ")


def _compiled(ev: Evidence, status: str) -> bool:
    """The run called torch.compile, which ran without compiling (not when the file limit stopped a compiler:
    the script turned compiling back on)."""
    called = any(c.function == "torch.compile" for r in ev.ranks for c in ev.calls.get(r, ()))
    return called and status != "file too large"


def _probe_failure(ev: Evidence) -> tuple[str, str] | None:
    """The grader's own code failed inside a rank's process: the grader's error, named as such."""
    errors = [e for r in ev.ranks for e in ev.probe_errors.get(r, ())]
    if not errors:
        return None
    first = errors[0]
    return GRADER_ERROR, (f"the grader's own {first.where} probe failed inside rank {first.rank}'s process "
                          f"({first.error}). This is the grader's error, not your submission's: the run is kept "
                          "for the instructor, and grading it again after the grader is fixed gives its verdict.")


def _launcher_killed(ev: Evidence, signum: int) -> str:
    """The launcher (the ranks' parent) was killed by ``signum`` before it could report: its records are lost."""
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
    started = sorted(r for r in ev.ranks if ev.last_record.get(r))
    seen = f" (the probes had heard from rank(s) {', '.join(map(str, started))})" if started else ""
    return (f"the grader's launcher, which starts the ranks and keeps their output, was killed by {name} from "
            f"outside the grader before the ranks ended{seen}, "
            "so their exit codes and output are lost. A rank that signals its parent process, the kernel's "
            "out-of-memory killer or someone on this machine did it; grade it again to tell which.")


def _waits(ev: Evidence, rank: int) -> bool:
    """The rank's last record says it went to wait: in a collective, or for point-to-point messages."""
    return ev.last_record.get(rank, {}).get("kind") in ("collective", "wait")


def _message_records(ev: Evidence) -> dict[int, waits.Record]:
    """The ranks whose last record is a ``wait``: the record of their messages (course.runtime.waits) then."""
    found = {}
    for rank in ev.ranks:
        last = ev.last_record.get(rank)
        if last is not None and last.get("kind") == "wait":
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):  # written by the rank's process
                found[rank] = waits.Record.from_dict(last["messages"])
    return found


def _where(ev: Evidence, rank: int, messages: dict[int, waits.Record]) -> str:
    """``rank 0 waits in barrier() (its collective #3)``, or ``rank 1 waits to receive from rank 0 (its irecv number
    1 from rank 0; rank 0 had sent it 0)``."""
    record = ev.last_record[rank]
    if record.get("kind") == "wait":
        return f"rank {rank} waits {waits.where(rank, messages) or 'for a point-to-point message'}"
    return f"rank {rank} waits in {record['op']}() (its collective #{record['seq']})"


def _hang(ev: Evidence, stopped: list[int], idle_s: float) -> tuple[str, str]:
    """``hang on rank k``: the ranks the launcher stopped had all made no progress for ``idle_s``; those not
    waiting in a collective or for a message are at fault (the others waited for them), or all of them if each
    waits."""
    at_fault = [r for r in stopped if not _waits(ev, r)] or stopped
    messages = _message_records(ev)
    waiting = [_where(ev, r, messages) for r in ev.ranks if _waits(ev, r)]
    names = ", ".join(str(r) for r in at_fault)
    quiet = (f"no rank made progress for {idle_s:g} s (none computed or called a collective), so the run "
             "was stopped. ")
    if all(_waits(ev, r) for r in at_fault):
        what = "for what the others never send or join" if messages else "in a collective the others never join"
        detail = quiet + f"Rank(s) {names} each wait {what}: " + "; ".join(waiting)
    else:
        detail = (quiet + f"Rank(s) {names} never got to where the other ranks were"
                  + (": " + "; ".join(waiting) if waiting else ""))
    if messages:
        wrong = waits.wrong_peers(messages)
        return f"hang on rank {names}", (detail + (f". {'; '.join(wrong)}" if wrong else "")
                                         + ". Every message a rank waits for must be sent to it: check the peer "
                                         "ranks of your sends and receives.")
    return f"hang on rank {names}", detail + ". Every rank must reach every collective, in the same order."


def _still_working(ev: Evidence, config: GradingConfig) -> str:
    """Why a run that hit the time limit was not called stuck: its ranks were still working. Names the ranks still
    working and those that waited for them, and the limit used and why."""
    unfinished = [r for r in ev.ranks if not ev.ends.get(r)]
    working = [r for r in unfinished if not _waits(ev, r)]
    messages = _message_records(ev)
    waiting = [_where(ev, r, messages) for r in unfinished if _waits(ev, r)]
    if working and len(working) < ev.world_size:
        who = (f"rank {working[0]} was" if len(working) == 1 else f"ranks {', '.join(map(str, working))} were")
    else:
        who = "the ranks were"
    who += " still using processor time"
    return (f"the run did not finish within the time limit, and every rank and DataLoader worker was stopped. "
            f"It was not stuck: {who} when the limit ran out"
            + (" (" + "; ".join(waiting) + ")" if waiting else "")
            + ". An endless loop, or far more work than the assignment asks for, looks like this. "
            + _pace(config).why(config.limits.wall_s))


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
            argv = [*python_argv(), "-c", _EVALUATE_WHEN_TOLD, "checkpoint.pt", "--seed", str(seed),
                    "--test-data", "test.pt"]
            total_s = config.limits.wall_s + config.eval_limits.wall_s  # it starts with the run
            limits = _paced(replace(config.eval_limits, wall_s=total_s), config)
            return sandbox.run(argv, cwd=self.folder, env={**run_env(), GO_FD_ENV: str(self._go_r)}, limits=limits,
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


def _checkpoint(run_dir: Path, evaluation: _Evaluation, records: RunRecords, config: GradingConfig) -> Checkpoint:
    """The grader's verdict on the run's checkpoint: its scores from the clean sandboxed evaluation process,
    kept only if it holds parameters rank 0's optimizer produced (:func:`grader.evidence.judge_checkpoint`)."""
    checkpoint = run_dir / config.assignment.checkpoint
    if not checkpoint.is_file():
        return Checkpoint(error=f"no checkpoint at {config.assignment.checkpoint}: save model.state_dict() there "
                                "on rank 0 after training.")
    result = evaluation.give(checkpoint)
    try:
        verdict = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        verdict = None
    if not isinstance(verdict, dict):
        return Checkpoint(error=f"the checkpoint could not be evaluated ({result.status}: {result.detail}).")
    return judge_checkpoint(records, verdict, checkpoint.name)


def not_run(name: str, status: str, detail: str, config: GradingConfig = GradingConfig(),
            start: float | None = None, output: str = "") -> Results:
    """Results for a submission that was not run, or not to the end (``bad submission``, ``grader error``,
    ``interrupted``): every check listed as not run (:func:`grader.rubric.apply`), the reason ``detail`` said
    once; ``output`` is what the run printed before it was stopped, if it ran."""
    return rubric.apply(Results(name, status, detail, output=output), None, config.assignment, config.visible_only,
                        time.monotonic() if start is None else start)
