"""The grader's own score: does it name each planted mistake by the right check, and give correct scripts full marks?

    python benchmarks/grader_score.py [NAME ...]   (default: every submission of the two sets)

It grades the proof set (tests/grader/test_submissions.py) and the fair-idiom set (tests/grader/test_fair_idioms.py)
for real, three at a time as the test session does, and reads what each should get from those test modules
themselves: one declaration of the expectations. It prints a line per submission, then two counts:

* planted mistakes named by the right check: the run ended with the expected status and failed exactly the
  expected checks (``target_accuracy`` left aside for scripts that train near the target, as the tests do);
* correct scripts with full marks: 100 of 100, every check assessed.

Expensive (about 55 four-rank runs, half an hour on 2 shared cores): run it by hand, once, under /work/slot.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the test modules import `accusations` from tests/

from grader.results import Results  # noqa: E402
from grader.runner import GradingConfig, grade  # noqa: E402
from tests.grader import test_fair_idioms as fair  # noqa: E402
from tests.grader import test_submissions as proof  # noqa: E402

WORKERS = 3  # as tests/grader/conftest.py


@dataclass(frozen=True)
class Expected:
    """What one submission should get: full marks, or a status and the exact checks it fails."""

    correct: bool
    status: str | None = None  # None: any status but "ok"
    failed: frozenset[str] | None = None  # None: not compared (the status names the mistake)
    near_target: bool = False  # target_accuracy left aside
    config: GradingConfig = GradingConfig()


def expectations() -> dict[str, Expected]:
    """Every submission of the two sets and what it should get, from the test modules' own tables."""
    out = {}
    for name, (status, failed) in proof.EXPECTED.items():
        out[name] = Expected(correct=(status, failed) == ("ok", set()), status=status, failed=frozenset(failed),
                             near_target=name in proof.NEAR_TARGET, config=proof.CONFIGS.get(name, proof.BASE))
    for name in fair.CORRECT:
        out[name] = Expected(correct=True, status="ok", failed=frozenset(), config=fair.CONFIGS.get(name, fair.BASE))
    for name, (status, failed) in fair.MISTAKES.items():
        out[name] = Expected(correct=False, status=status, failed=frozenset(failed) if failed is not None else None,
                             near_target=name in fair.NEAR_TARGET, config=fair.CONFIGS.get(name, fair.BASE))
    return out


def verdict(results: Results, expected: Expected) -> tuple[bool, str]:
    """Whether ``results`` is what ``expected`` says, and what it got, in a few words."""
    failed = {c.name for c in results.checks if not c.passed and c.assessed}
    if expected.near_target:
        failed.discard("target_accuracy")
    got = f"{results.status}, {results.score:g}/{results.max_score:g}, failed {sorted(failed) or 'nothing'}"
    if expected.correct:
        full = (results.status, results.score, results.max_score) == ("ok", 100, 100)
        return full and all(c.assessed for c in results.checks), got
    if expected.status is None:
        return results.status != "ok", got
    return results.status == expected.status and (expected.failed is None or failed == expected.failed), got


def main(argv: list[str]) -> int:
    table = expectations()
    unknown = [name for name in argv if name not in table]
    if unknown:
        print(f"no such submission in the two sets: {', '.join(unknown)}; expected one of {', '.join(table)}")
        return 2
    names = argv or list(table)
    names.sort(key=lambda name: table[name].config == GradingConfig())  # own limits first
    start = time.perf_counter()

    def one(name: str) -> tuple[str, Results]:
        return name, grade(proof.SUBMISSIONS / f"{name}.py", table[name].config)

    with ThreadPoolExecutor(WORKERS) as pool:
        graded = dict(pool.map(one, names))
    right = {True: [0, 0], False: [0, 0]}  # correct? -> [as expected, of]
    for name in sorted(names, key=lambda n: (not table[n].correct, n)):
        ok, got = verdict(graded[name], table[name])
        right[table[name].correct][0] += ok
        right[table[name].correct][1] += 1
        kind = "correct" if table[name].correct else "mistake"
        print(f"{'PASS' if ok else 'FAIL'}  {kind:7s}  {name:30s}  {got}")
    print(f"\nplanted mistakes named by the right check: {right[False][0]} of {right[False][1]}")
    print(f"correct scripts with full marks:           {right[True][0]} of {right[True][1]}")
    print(f"({len(names)} gradings, {WORKERS} at a time, {time.perf_counter() - start:.0f} s on this machine)")
    return 0 if right[True][0] == right[True][1] and right[False][0] == right[False][1] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
