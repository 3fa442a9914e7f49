"""How a run ended, decided in one place: its :class:`Outcome`, the :class:`Limits` it ran under, and the words.

:func:`classify` reads a run that ended by itself (its exit code and error output); :func:`breach` names a
limit the watchdog saw broken (:func:`course.runtime.process.run` stops the run then). :func:`resource_error` finds
a resource error in one process's error output; the grader's runner uses it per rank. Every detail is said
in course terms, with the fix (notebook 06).
"""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass

import psutil

STATUSES = ("ok", "error", "timeout", "out of memory", "too many processes", "output limit",
            "file too large", "cpu limit", "interrupted")
INTERRUPTED = ("the grader was stopped before the run ended (its process got a signal to stop): this says nothing "
               "about the submission, whose output so far is kept; grade it again.")
#: What a process prints when an allocation fails (Python, glibc, C++).
MEMORY_ERRORS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "can't allocate memory")
# CUDA's host side (driver, context, pinned buffers) takes GBs of private memory per GPU process: not measured
# here (no GPU), so GPU machines get generous limits: 16 GiB per process, 60% of the machine in all.
_GPU = os.path.exists("/dev/nvidiactl")
_MEMORY_PER_PROCESS = 16 * 2**30 if _GPU else 3 * 2**30
_RAM_60 = int(0.6 * psutil.virtual_memory().total)
_MEMORY_TOTAL = _RAM_60 if _GPU else min(12 * 2**30, _RAM_60)


@dataclass(frozen=True)
class Limits:
    """What one run may use. Defaults fit a 4-rank CPU or GPU run of the course CNN.

    The watchdog of :func:`course.runtime.process.run` enforces ``wall_s``, ``memory_total_bytes``,
    ``max_processes`` and ``max_output_bytes`` from outside; the per-process ones are rlimits, set where the
    command is started (:mod:`grader.sandbox`).
    """

    wall_s: float = 120.0  # whole run, every process it started
    memory_bytes: int = _MEMORY_PER_PROCESS  # per process heap + private writable memory (RLIMIT_DATA, see
    # grader.sandbox): 3 GiB, or 16 GiB on machines with NVIDIA GPUs
    memory_total_bytes: int = _MEMORY_TOTAL  # resident memory of all processes together (watchdog): 60% of
    # this machine's memory, at most 12 GiB without GPUs
    max_processes: int = 64  # processes alive at once in the run (watchdog; RLIMIT_NPROC backs it)
    max_threads: int = 1024  # tasks (processes + threads) at once: RLIMIT_NPROC, which the kernel counts so
    file_size_bytes: int = 64 * 2**20  # largest file a process may write (RLIMIT_FSIZE)
    cpu_s: int = 600  # CPU seconds per process (RLIMIT_CPU)
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr): the head and a tail; the rest is dropped
    max_output_bytes: int = 64 * 2**20  # written per stream before the run is stopped ("output limit")
    network: bool = False  # False: loopback only, where the OS allows a private network namespace

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name != "network" and not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")
        if self.output_bytes > self.max_output_bytes:
            raise ValueError(f"Limits.output_bytes ({self.output_bytes}) must not exceed max_output_bytes "
                             f"({self.max_output_bytes}): output is kept up to the first and counted up to the second")


@dataclass(frozen=True)
class Outcome:
    """How a run ended."""

    status: str  # one of STATUSES
    returncode: int | None  # exit code of the command; -N if signal N ended it; None if the runner stopped it
    stdout: str  # what the capped reader kept, with a marker saying how much was dropped
    stderr: str
    elapsed_s: float = 0.0
    detail: str = ""  # human-readable explanation of the status, in course terms


def size(n: int) -> str:
    """``3 GiB``, ``512 MiB``."""
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def resource_error(stderr: str) -> str | None:
    """``"out of memory"`` or ``"too many processes"`` if one process's error output shows it ran out, else None."""
    if any(s in stderr for s in MEMORY_ERRORS):
        return "out of memory"
    if "Resource temporarily unavailable" in stderr or "can't start new thread" in stderr:
        return "too many processes"
    return None


def cause_in(stderr: str, limits: Limits | None = None) -> tuple[str, str] | None:
    """(status, detail) if ``stderr`` shows a process that ran out of memory or of processes, else None."""
    limits = limits or Limits()
    if any(s in stderr for s in MEMORY_ERRORS):
        return "out of memory", (f"a process ran out of memory (limit {size(limits.memory_bytes)} per "
                                 "process): use smaller per-rank batches, and do not keep every step's tensors.")
    if "Resource temporarily unavailable" in stderr and "fork" in stderr.lower():
        return "too many processes", (f"the program could not start more processes (limit "
                                      f"{limits.max_processes}): do not start processes in a loop.")
    if "can't start new thread" in stderr:
        return "too many processes", (f"the program could not start more threads (limit {limits.max_threads} "
                                      "processes and threads together): do not start threads in a loop.")
    return None


def classify(returncode: int | None, stderr: str, limits: Limits | None = None) -> tuple[str, str]:
    """Status and course-terms detail for a run that ended by itself (the evidence is its exit and stderr)."""
    limits = limits or Limits()
    if returncode == 0:
        return "ok", "the program finished normally"
    if returncode is None:
        return "error", "the program could not be started or its exit was not seen: its error output says why"
    if any(s in stderr for s in MEMORY_ERRORS):
        return cause_in(stderr, limits)  # type: ignore[return-value]
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "file too large", (f"the program wrote a file larger than {size(limits.file_size_bytes)}: "
                                  "save only the model's state_dict, on rank 0 only.")
    if returncode == -signal.SIGXCPU or "SIGXCPU" in stderr:
        return "cpu limit", f"a process used more than {limits.cpu_s} s of CPU time and was stopped."
    found = cause_in(stderr, limits)
    if found:
        return found
    if returncode == -signal.SIGKILL:
        return "error", "the program was killed (SIGKILL), possibly by the kernel because memory ran out"
    if returncode < 0:
        return "error", f"the program was killed by signal {signal_name(-returncode)}"
    return "error", f"the program exited with code {returncode}; its error output says why"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number no signal has."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_BREACHES = {  # limit -> (status, detail); {wall_s}, {output}, {processes}, {memory} come from the Limits
    "wall": ("timeout", "the run did not finish within {wall_s:g} s and every rank and DataLoader worker was stopped. "
             "A rank waiting in a collective that another rank never calls, or an endless loop, looks like this."),
    "output": ("output limit", "the run wrote more than {output} to one output stream and was stopped: print on "
               "rank 0 only, and not every step."),
    "processes": ("too many processes", "the run had more than {processes} processes at once and was stopped: 4 "
                  "ranks and a few DataLoader workers each are plenty; do not start processes in a loop."),
    "memory": ("out of memory", "the run's processes used more than {memory} of memory together and were stopped: "
               "keep per-rank batches and DataLoader workers small, and do not keep tensors of every step."),
}


def breach(limit: str, limits: Limits) -> tuple[str, str]:
    """(status, detail) for a limit the watchdog saw broken: ``wall``, ``output``, ``processes``, ``memory``,
    or ``stop`` (the runner was asked to stop)."""
    if limit == "stop":
        return "interrupted", INTERRUPTED
    if limit not in _BREACHES:
        raise ValueError(f"limit must be one of {', '.join(_BREACHES)}, stop; got {limit!r}")
    status, detail = _BREACHES[limit]
    return status, detail.format(wall_s=limits.wall_s, output=size(limits.max_output_bytes),
                                 processes=limits.max_processes, memory=size(limits.memory_total_bytes))
