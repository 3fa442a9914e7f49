"""Is a job slow or stuck? A rank is stuck only when it makes no progress, never merely because it is behind.

A rank makes progress while its CPU time grows (its own and that of every process it started, such as
DataLoader workers) by more than a background thread's (:func:`tolerance`), or while it does work that can be
counted (collectives called, messages posted, records written, output). A rank blocked in a collective that a
peer never joins uses almost no CPU (gloo's network thread wakes up now and then); a rank asleep, or one waiting
for a message nobody sends, uses none. A rank seen blocked in the same wait for a message at both ends
of a stretch (``Sample.blocked``, from :mod:`course.runtime.waits`) made no progress in it, whatever its CPU time:
the wait is the primary evidence, since on GPUs a rank blocked in nccl may spin a processor.
A rank that is behind (a busy machine, more work than its peers) keeps using CPU: it is waited for, up to a
hard time limit (:mod:`course.runtime.pace` scales it to the machine). On a crowded machine a working rank may get
almost no CPU for a while; it is then seen *runnable* (waiting for a processor, not for a peer), and that counts
as progress too.

The decision is pure: :func:`judge` takes a history of :class:`Sample` and returns a :class:`Verdict`. A job
is stuck when every rank still running has made no progress for ``window_s``: then nothing will ever move
again. One idle rank alone is not enough: it may be waiting for a peer that is still working.
:class:`Watch` takes the samples from ``/proc`` (:func:`cpu_seconds`). Used by the grader's launcher (through
:func:`course.runtime.process.finish_together`) and by :func:`course.runtime.launch.launch`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from course.runtime import process_tree

#: Seconds without progress after which a job is stuck (every rank still running idle that long).
WINDOW_S = 20.0
#: CPU seconds a rank may use and still count as idle, plus :data:`IDLE_CPU_SHARE` of the time looked back over.
IDLE_CPU_S = 0.05
#: Share of one core a rank may use and still count as idle. A rank blocked in a gloo collective is not at 0:
#: gloo's TCP loop thread wakes up now and then, about 0.003 s of CPU a second (0.05 s in 20 s, measured on a
#: grader run). A rank that computes uses far more, and one starved of CPU is seen runnable.
IDLE_CPU_SHARE = 0.01
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Sample:
    """One look at the ranks still running: when, and each one's progress so far."""

    t: float  # seconds (time.monotonic)
    cpu_s: Mapping[int, float]  # rank -> CPU seconds used so far by the rank and every process it started
    events: Mapping[int, int] = field(default_factory=dict)  # rank -> work counted so far (records, output)
    blocked: frozenset[int] = frozenset()  # ranks seen blocked in a wait for a message (their events tell which)
    runnable: frozenset[int] = frozenset()  # ranks with a process seen waiting for a processor (state R)


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` decided."""

    stuck: bool  # every rank still running has been idle for the window
    idle_s: dict[int, float]  # rank still running -> seconds it has made no progress (0.0: it just did)

    @property
    def busy(self) -> list[int]:
        """The ranks still running that made progress since the sample before the last, in rank order."""
        return sorted(r for r, s in self.idle_s.items() if s == 0.0)


def tolerance(span_s: float, idle_cpu_s: float = IDLE_CPU_S) -> float:
    """CPU seconds a rank may use over ``span_s`` seconds and still count as idle: ``idle_cpu_s`` plus
    :data:`IDLE_CPU_SHARE` of the span (background threads that wake up now and then)."""
    return idle_cpu_s + IDLE_CPU_SHARE * span_s


def idle_for(samples: Sequence[Sample], rank: int, idle_cpu_s: float = IDLE_CPU_S) -> float:
    """Seconds ``rank`` has made no progress as of the last sample: how far back the samples go over which its
    CPU time grew by at most :func:`tolerance`, it was never seen runnable (or it was blocked in a wait at both
    ends) and its events did not change. 0.0 if it progressed since the one before, or is runnable now.
    """
    last = samples[-1]
    if rank not in last.cpu_s:
        return 0.0
    since, runnable = last.t, rank in last.runnable
    for sample in reversed(samples[:-1]):
        if rank not in sample.cpu_s:
            break
        waited = rank in last.blocked and rank in sample.blocked  # in one wait throughout: events unchanged too
        grew = last.cpu_s[rank] - sample.cpu_s[rank] > tolerance(last.t - sample.t, idle_cpu_s)
        moved = (grew or runnable) and not waited
        counted = last.events.get(rank, 0) != sample.events.get(rank, 0)
        if moved or counted:
            break
        since, runnable = sample.t, runnable or rank in sample.runnable
    return last.t - since


def judge(samples: Sequence[Sample], window_s: float = WINDOW_S, idle_cpu_s: float = IDLE_CPU_S) -> Verdict:
    """Stuck or not, from the history of ``samples`` (oldest first): stuck when every rank in the last sample
    (those still running) has made no progress for ``window_s`` seconds.

    Raises:
        ValueError: no samples, or a window that is not a positive number of seconds.
    """
    if not samples:
        raise ValueError("judge() needs at least one Sample of the ranks still running, got none")
    if not window_s > 0:
        raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
    idle = {rank: idle_for(samples, rank, idle_cpu_s) for rank in sorted(samples[-1].cpu_s)}
    return Verdict(bool(idle) and all(s >= window_s for s in idle.values()), idle)


def cpu_seconds(tree: list[int]) -> float:
    """CPU seconds used so far by the processes of ``tree`` (a rank and every process below it; children they
    waited for included)."""
    return sum(_cpu(p) for p in tree)


def runnable_now(tree: list[int], table: dict[int, tuple[int, str]]) -> bool:
    """Whether a process of ``tree`` is running or waiting for a processor now (``/proc`` state R in ``table``).

    A rank blocked in a collective, or asleep, is in state S. One that is working on a crowded machine is R even
    while the scheduler gives it no CPU.
    """
    return any(table.get(p, (0, ""))[1] == "R" for p in tree)


def _cpu(pid: int) -> float:
    """user + system time of ``pid`` and of its children that it has waited for, in seconds; 0.0 if gone."""
    if process_tree.HAS_PROC:
        fields = process_tree.stat_fields(pid)
        return 0.0 if fields is None else sum(int(v) for v in fields[11:15]) / _TICK  # utime, stime, cutime, cstime
    try:
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system + times.children_user + times.children_system
    except psutil.Error:
        return 0.0


class Watch:
    """Samples ranks' progress and judges it: ``watch.look({rank: pid}, events)`` returns a :class:`Verdict`.

    Keeps only the samples the window needs. A rank left out of ``pids`` (it ended) is no longer judged.
    """

    def __init__(self, window_s: float = WINDOW_S, idle_cpu_s: float = IDLE_CPU_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
        self.window_s, self.idle_cpu_s = window_s, idle_cpu_s
        self.samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> Verdict:
        """Judge the history with ``sample`` added (the pure half of :meth:`look`)."""
        self.samples.append(sample)
        while len(self.samples) > 2 and self.samples[1].t <= sample.t - self.window_s:
            self.samples.popleft()  # the oldest that still reaches back a whole window is kept
        return judge(list(self.samples), self.window_s, self.idle_cpu_s)

    def look(self, pids: Mapping[int, int], events: Mapping[int, int] | None = None, now: float | None = None,
             blocked: frozenset[int] = frozenset()) -> Verdict:
        """Sample the CPU time and state of each rank's process tree (``rank -> pid``) and judge; ``events`` and
        ``blocked`` as in :class:`Sample`."""
        table = process_tree.process_table()
        trees = {rank: [pid, *process_tree.descendants(pid, table)] for rank, pid in pids.items()}
        cpu = {rank: cpu_seconds(tree) for rank, tree in trees.items()}
        runnable = frozenset(rank for rank, tree in trees.items() if runnable_now(tree, table))
        return self.add(Sample(time.monotonic() if now is None else now, cpu, dict(events or {}), frozenset(blocked),
                               runnable))
