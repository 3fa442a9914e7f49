"""Does a correct submission keep full marks while other programs load the machine? (issue 35)

    python benchmarks/grading_under_load.py            # the reference and every correct fair idiom, 3 busy loops
    python benchmarks/grading_under_load.py --quick    # the reference alone, 2 busy loops: a quick CPU check
    python benchmarks/grading_under_load.py --load 4   # as many busy loops as you like

While ``--load`` processes spin on the processors (plain ``while True`` loops, at the grader's own priority), it
grades the reference solution and the correct idioms of tests/grader/test_fair_idioms.py (its ``CORRECT``), one at
a time with the grader's default configuration, and prints each one's status, score and grading time, and the
machine's pace (:mod:`course.runtime.pace`) measured before the load and under it. Target: every one gets full
marks. A run that makes progress is waited for (up to its limit, scaled to the pace), so load alone must not
turn a correct run into a "hang" or a "timeout".

Expensive in its full mode (six four-rank runs on a loaded machine): run it by hand, not in the test suite.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

from course.runtime import pace
from grader.runner import GradingConfig, grade

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = ROOT / "tests" / "submissions"
FAIR_IDIOMS = ROOT / "tests" / "grader" / "test_fair_idioms.py"


def correct_idioms() -> tuple[str, ...]:
    """The ``CORRECT`` tuple of tests/grader/test_fair_idioms.py, read without importing the test module."""
    for node in ast.parse(FAIR_IDIOMS.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CORRECT" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{FAIR_IDIOMS} defines no CORRECT tuple of correct idioms any more: update this benchmark")


def busy_loops(count: int) -> list[subprocess.Popen]:
    """``count`` processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/grading_under_load.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the reference alone, under 2 busy loops")
    parser.add_argument("--load", type=int, default=None, help="busy-loop processes (default 3, or 2 with --quick)")
    args = parser.parse_args(argv)
    load = args.load if args.load is not None else (2 if args.quick else 3)
    names = ("reference",) if args.quick else ("reference", *correct_idioms())
    quiet = pace.pace_of(_timed_workload())
    loops = busy_loops(load)
    failures = []
    try:
        time.sleep(1.0)  # the loops are spinning
        loaded = pace.pace_of(_timed_workload())
        print(f"{load} busy loops on {_cpus()} CPUs; pace before the load {quiet.factor:.1f}x, under it "
              f"{loaded.factor:.1f}x (limits scale by the grader's own measurement)", flush=True)
        for name in names:
            start = time.perf_counter()
            results = grade(SUBMISSIONS / f"{name}.py", GradingConfig())
            took = time.perf_counter() - start
            full = results.status == "ok" and results.score == results.max_score
            print(f"  {name:24s} {results.status:18s} {results.score:5g} / {results.max_score:g}   {took:6.1f} s   "
                  f"{'PASS' if full else 'FAIL'}", flush=True)
            if not full:
                failures.append(name)
                print("    " + results.detail[:600], flush=True)
                for check in results.checks:
                    if not check.passed:
                        print(f"    {check.name}: {check.message[:300]}", flush=True)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    verdict = "PASS" if not failures else f"FAIL ({', '.join(failures)})"
    print(f"every correct script gets full marks under load: {verdict}")
    return 0 if not failures else 1


def _timed_workload() -> float:
    start = time.perf_counter()
    pace._workload()
    return time.perf_counter() - start


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    sys.exit(main())
