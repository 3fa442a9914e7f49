"""How fast is this machine right now? Time limits grow when it runs slower than the machine they were set on.

A time limit such as the grader's 180 s was set on a quiet machine. On a busy one (other jobs sharing the
processors) or a slow one, a correct run takes longer. :func:`machine_pace` times a small fixed workload once per
process and compares it with what it takes on the reference machine; :meth:`Pace.limit` scales a limit by that
factor (never below 1, at most :data:`MAX_FACTOR`), and :meth:`Pace.why` says so in plain words. Used by the
grader (:mod:`grader.runner`) and by :func:`course.runtime.launch.launch` (the labs' runs).

A limit only caps a run that keeps working: a run that stops making progress is stopped sooner, whatever the
machine's pace (:mod:`course.runtime.progress`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

#: Iterations of the fixed workload (:func:`_workload`): about 0.14 s of one core on the reference machine.
WORKLOAD_ITERATIONS = 2_000_000
#: Seconds the workload takes on the reference machine (the course's 2-core CPU VM, quiet: its CPU time there).
REFERENCE_S = 0.14
#: A limit grows at most this many times: past it, a machine is too busy to grade on, and waiting longer does
#: not help.
MAX_FACTOR = 4.0


@dataclass(frozen=True)
class Pace:
    """How many times slower than the reference machine this one ran the fixed workload."""

    factor: float  # 1.0 (as fast, or faster) to MAX_FACTOR
    measured_s: float = REFERENCE_S  # what the workload took here, in seconds of wall-clock time

    def limit(self, base_s: float) -> float:
        """``base_s`` (a limit set on the reference machine) scaled to this machine's pace, in seconds."""
        return base_s * self.factor

    def why(self, base_s: float) -> str:
        """One sentence for a learner: the limit used and why it is what it is."""
        if self.factor <= 1.0:
            return f"The time limit was {base_s:g} s."
        return f"The time limit was {self.limit(base_s):.0f} s: {self.stretched(base_s)}."

    def stretched(self, base_s: float) -> str:
        """Why the limit is longer than ``base_s``, as a clause (``""`` when it is not)."""
        if self.factor <= 1.0:
            return ""
        return (f"the usual {base_s:g} s times {self.factor:.1f}, because this machine ran a fixed test "
                f"{self.factor:.1f} times slower than usual (other programs were using its processors)")


def pace_of(measured_s: float, reference_s: float = REFERENCE_S) -> Pace:
    """The :class:`Pace` of a machine that ran the workload in ``measured_s`` seconds (pure: for tests).

    Raises:
        ValueError: ``measured_s`` or ``reference_s`` is not a positive number of seconds.
    """
    if not (measured_s > 0 and reference_s > 0):
        raise ValueError(f"measured_s and reference_s must be positive seconds, got {measured_s!r} and "
                         f"{reference_s!r}")
    return Pace(min(max(measured_s / reference_s, 1.0), MAX_FACTOR), measured_s)


def _workload(iterations: int = WORKLOAD_ITERATIONS) -> int:
    """Plain Python arithmetic: one core, no memory traffic, no library whose speed differs between versions."""
    total = 0
    for i in range(iterations):
        total += (i * i) % 7
    return total


@functools.cache
def machine_pace() -> Pace:
    """This machine's :class:`Pace`, measured once per process (about 0.14 s on a quiet machine)."""
    start = time.perf_counter()
    _workload()
    return pace_of(time.perf_counter() - start)
