"""When has an optimizer converged? A criterion the student writes, and a checker that gives feedback.

The criterion: the first record at which the loss is within ``eps`` of the optimal loss and stays within
it for ``k`` consecutive records. One lucky noisy step of SGD must not count, hence ``k``. Taught in
``notebooks/01_gd_vs_sgd.ipynb`` (exercise): the notebook ships a stub for the student to fill in, and its
later cells use :func:`updates_to_converge`, the library's version.

    check_updates_to_converge(updates_to_converge)   # prints which cases pass, and a hint for the first miss
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from course import exercise

Criterion = Callable[[Sequence[float], float, float, int], "int | None"]


def updates_to_converge(loss: Sequence[float], optimum: float, eps: float, k: int) -> int | None:
    """Index of the first of ``k`` consecutive records with ``|loss - optimum| <= eps``; None if there is none.

    Args:
        loss: ``(R,)`` the loss at each record, ``loss[0]`` before any update (e.g. ``Trajectory.loss``).
        optimum: the optimal loss. eps: the tolerance, inclusive. k: records in a row required, >= 1.
    """
    run = 0  # records in a row within eps so far
    for index, value in enumerate(loss):
        run = run + 1 if abs(value - optimum) <= eps else 0
        if run == k:
            return index - k + 1
    return None


@dataclass(frozen=True)
class Case:
    """One input to the criterion, the answer it must give, and a hint for getting it wrong."""

    name: str
    loss: tuple[float, ...]
    optimum: float
    eps: float
    k: int
    expected: int | None  # worked out by hand, so that a bug in updates_to_converge cannot hide here
    hint: str


CASES = (
    Case("converges and stays", (5.0, 3.0, 1.5, 1.2, 1.1, 1.05), 1.0, 0.25, 2, 3,
         "return the index of the FIRST of the k records, not the last one."),
    Case("a lucky dip does not count", (5.0, 1.1, 3.0, 2.0, 1.1, 1.1, 1.1), 1.0, 0.25, 3, 4,
         "the k records within eps must be consecutive: restart counting when the loss leaves the band."),
    Case("never converges", (5.0, 4.0, 3.0, 2.0), 1.0, 0.25, 1, None,
         "return None when no run of k records within eps exists (not -1, not 0, not len(loss))."),
    Case("too few records left at the end", (5.0, 4.0, 1.1, 1.1), 1.0, 0.25, 3, None,
         "a run that is cut off by the end of the loss curve is shorter than k: it does not count."),
    Case("already converged at the start", (1.0, 1.1, 1.0), 1.0, 0.25, 2, 0,
         "record 0 (the loss before any update) counts: the answer can be 0."),
    Case("exactly eps away counts as within", (3.0, 1.5, 1.5), 1.0, 0.5, 2, 1,
         "within eps means |loss - optimum| <= eps (inclusive)."),
    Case("below the optimum is also a distance", (3.0, 0.25, 0.25, 0.9, 0.95), 1.0, 0.25, 2, 3,
         "measure the distance |loss - optimum|: a loss far below the given optimum is not within eps."),
    Case("k = 1: the first record within eps", (9.0, 8.0, 1.2, 7.0), 1.0, 0.25, 1, 2,
         "with k = 1 the answer is simply the first record within eps."),
)


def _run(criterion: Criterion, case: Case) -> tuple[object, str | None]:
    try:
        got = criterion(list(case.loss), case.optimum, case.eps, case.k)
    except NotImplementedError:
        raise  # the untouched stub: exercise.checker says "not attempted yet"
    except Exception as error:  # noqa: BLE001 - the student's code may raise anything; one case's feedback
        return None, f"raised {type(error).__name__}: {error}"
    if isinstance(got, (np.integer,)):
        got = int(got)
    if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
        return got, f"returned {got!r} of type {type(got).__name__}; expected an int index or None."
    return got, None


@exercise.checker
def check_updates_to_converge(criterion: Criterion) -> bool:
    """Exercise checker: run the student's ``criterion(loss, optimum, eps, k)`` on every case in :data:`CASES`.

    ``criterion`` returns the index of the first of ``k`` consecutive records with ``|loss - optimum| <= eps``, or
    ``None`` when there is none. Prints one line per case, and a hint for each case that failed (a stub or a
    non-function gets :func:`course.exercise.checker`'s feedback instead); returns True when every case passes.
    """
    lines, passed = [], 0
    for case in CASES:
        got, problem = _run(criterion, case)
        if problem is None and got == case.expected:
            passed += 1
            lines.append(f"  ok    {case.name}")
            continue
        what = problem or f"expected {case.expected!r}, got {got!r}"
        lines.append(f"  FAIL  {case.name}: loss={list(case.loss)}, optimum={case.optimum}, eps={case.eps}, "
                     f"k={case.k}: {what}\n        hint: {case.hint}")
    verdict = "All" if passed == len(CASES) else "Only"
    print("\n".join([f"{verdict} {passed} of {len(CASES)} cases pass.", *lines]))
    return passed == len(CASES)
