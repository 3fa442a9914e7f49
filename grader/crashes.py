"""Which rank's failure ended a graded run, and that rank's own error, trimmed for the student.

When one rank raises, its peers fail a moment later in their next collective with a *secondary* error about
the lost connection (gloo: "Connection reset by peer", "Connection closed by peer"; NCCL: "remote process
exited"). The student must see the first rank's own traceback, not its peers' echoes of it, so the first
failure is the earliest to exit (by the launcher's exit times) among the ranks whose error is their own.
When every failure is secondary, the ranks that left early with exit code 0 are the cause ("only rank 0
trains": ranks 1-3 skip the loop and exit, rank 0 loses them in its first collective).
"""

from __future__ import annotations

import re
import signal
import textwrap
from dataclasses import dataclass

from course.runtime.root_cause import PEER_LOST, TRACEBACK, trim  # PEER_LOST: how a rank that only lost a peer ends
from grader.evidence import RunRecords

# frames of the grader's own code between the student's script and the interpreter: not the student's concern
_HIDDEN_FRAMES = ("grader/inrank/", "<frozen runpy>")  # inrank: everything the grader runs in a rank
MAX_TRACEBACK_LINES, MAX_TRACEBACK_CHARS = 30, 2500


@dataclass(frozen=True)
class Failure:
    """Why a run failed: ``status`` (``crash on rank 2``), ``detail`` for the student, the ``rank`` to show."""

    status: str
    detail: str
    rank: int


def failed_ranks(ev: RunRecords) -> list[int]:
    """Ranks that exited non-zero by themselves: not stopped by the launcher, not torn down after the script."""
    failed = [r for r, e in sorted(ev.exits.items()) if e.returncode != 0 and not e.stopped]
    return [r for r in failed if not any(end.exit_code == 0 for end in ev.ends.get(r, ()))]


def exit_time(ev: RunRecords, rank: int) -> tuple[float, int]:
    """When ``rank`` exited, for sorting: the launcher's exit time, then its exit order (older records)."""
    exit_ = ev.exits[rank]
    seconds = exit_.exit_s
    return (float("inf") if seconds is None else seconds, rank if exit_.order is None else exit_.order)


def error_text(ev: RunRecords, rank: int) -> str:
    """The rank's error: the traceback its ``end`` record carries (the script raised), else its stderr."""
    for end in reversed(ev.ends.get(rank, ())):
        if end.error:
            return end.error
    return ev.exits[rank].stderr


def is_secondary(ev: RunRecords, rank: int) -> bool:
    """``rank`` failed only because a peer went away: its last error line names a lost connection."""
    if ev.exits[rank].returncode < 0:  # killed by a signal (segfault, the OOM killer): its own failure
        return False
    return any(marker in _last_error(error_text(ev, rank)) for marker in PEER_LOST)


def first_failure(ev: RunRecords, failed: list[int]) -> Failure:
    """The failure to name among ``failed`` (non-empty, see :func:`failed_ranks`), with its trimmed error."""
    primary = [r for r in failed if not is_secondary(ev, r)]
    if primary:
        first = min(primary, key=lambda r: exit_time(ev, r))
        said = (f"rank {first} failed, with the error below; the other ranks ended without an error"
                if failed == [first] and _others_ended_well(ev, first)  # a rule checked as the ranks end
                else f"rank {first} failed first, with the error below; the other ranks could not go on without it")
        return Failure(f"crash on rank {first}", f"{said}.\n{_indented(ev, first)}", first)
    first = min(failed, key=lambda r: exit_time(ev, r))
    early = [r for r, e in sorted(ev.exits.items())
             if e.returncode == 0 and not e.stopped and exit_time(ev, r) <= exit_time(ev, first)]
    if early:
        return _early_exit(ev, early, failed, first)
    return Failure(f"crash on rank {first}", f"rank {first} lost its connection to another rank, and no rank "
                   "reported an error of its own (a rank may have been killed from outside). Its error:\n"
                   f"{_indented(ev, first)}", first)


def _others_ended_well(ev: RunRecords, rank: int) -> bool:
    """Every rank but ``rank`` exited with code 0 by itself."""
    return all(e.returncode == 0 and not e.stopped for r, e in ev.exits.items() if r != rank)


def missing_library(text: str) -> str | None:
    """The module a ``ModuleNotFoundError`` in ``text`` names (``accelerate``), or None."""
    found = re.findall(r"ModuleNotFoundError: No module named '([\w.]+)'", text)
    return found[-1].split(".")[0] if found else None


def over_file_limit(ev: RunRecords, rank: int) -> bool:
    """``rank``, or a process it started (the compiler of torch.compile), was stopped for writing a file over
    the sandbox's per-file limit (RLIMIT_FSIZE: SIGXFSZ, or EFBIG "File too large")."""
    text = error_text(ev, rank) + ev.exits[rank].stderr
    return ev.exits[rank].returncode == -signal.SIGXFSZ or any(
        marker in text for marker in ("SIGXFSZ", "File size limit exceeded", "File too large"))


def _early_exit(ev: RunRecords, early: list[int], failed: list[int], first: int) -> Failure:
    names, waiting = _names(early), _names(failed)
    steps = {r: len(ev.steps.get(r, ())) for r in (*early, *failed)}
    took = ("took no optimizer step" if not any(steps[r] for r in early)
            else "took " + ", ".join(f"{steps[r]} optimizer step(s) on rank {r}" for r in early))
    detail = (f"rank(s) {names} {took} and exited early (exit code 0) while rank(s) {waiting} still needed them "
              f"(rank {first} took {steps[first]} step(s)): rank {first} then failed in its next collective "
              f"({_lost(ev, first)}). Every rank must run the whole training loop, "
              "every collective included; only saving and printing belong to rank 0 alone.")
    return Failure(f"early exit on rank {names}", detail, first)


def _lost(ev: RunRecords, rank: int) -> str:
    error = _last_error(error_text(ev, rank))
    return next((marker for marker in PEER_LOST if marker in error), error[:200])


def _names(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _last_error(text: str) -> str:
    """The exception line that ends a traceback (the last line that is not a frame, nor a torch warning)."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith(" ")]
    return lines[-1] if lines else ""


def _indented(ev: RunRecords, rank: int) -> str:
    code = ev.exits[rank].returncode
    text = trimmed_traceback(error_text(ev, rank))
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        text = f"killed by signal {name}" + (f"\n{text}" if text else "")
    return textwrap.indent(text or f"exit code {code}, and nothing on its error output", "    ")


def trimmed_traceback(text: str) -> str:
    """The last traceback in ``text``, without the grader's frames and with short paths; else its last lines.

    ``File "/tmp/grade-x/run/train_4gpu.py"`` becomes ``File "train_4gpu.py"`` and a library's path starts at
    its package (``File "torch/nn/parallel/distributed.py"``); at most MAX_TRACEBACK_LINES lines, the last.
    """
    lines = text.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
    if not starts:
        return "\n".join(lines[-8:])[-MAX_TRACEBACK_CHARS:]
    kept, hidden = [], False
    for line in lines[starts[-1]:]:
        if line.startswith('  File "'):
            hidden = any(frame in line for frame in _HIDDEN_FRAMES)
        elif not line.startswith("    "):
            hidden = False
        if not hidden:
            kept.append(_short_paths(line))
    return trim("\n".join(kept), MAX_TRACEBACK_LINES - 1)[-MAX_TRACEBACK_CHARS:]  # with its "... not shown" line


def trimmed_stderr(text: str, before_chars: int = 1500) -> str:
    """``text`` (a rank's error output) with its last traceback trimmed, and at most ``before_chars`` before it."""
    start = text.rfind(TRACEBACK)
    if start < 0:
        return text[-3000:]
    before = text[:start]
    return before[-before_chars:] + trimmed_traceback(text[start:]) + "\n"


def _short_paths(line: str) -> str:
    line = re.sub(r'File "[^"]*/grade-[^/"]*/run/', 'File "', line)
    return re.sub(r'File "[^"]*/(?:site|dist)-packages/', 'File "', line)
