"""How long checking one lab takes: each registered lab's visible check on its reference solution, and the stub.

    python benchmarks/labs.py [LAB ...]    (default: every lab in grader.labs.LABS)

Target (issue 22): at most 30 s for one lab's visible check (what the notebook's check cell and ``grader check``
run), printed next to what was measured here and judged PASS or FAIL; the stub's check (one run, stopped as soon
as it is found in place) beside it, since that is what a notebook runs under nbval. Measured on this machine
(emulated GPUs on its CPU) under whatever else runs on it: the load average is printed with them, and on a
loaded machine a FAIL may say more about the load than about the lab. The grader's hidden runs are not timed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from grader.labs import LABS, run_lab

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 30.0


def timed(lab_name: str, path: Path) -> tuple[float, bool]:
    start = time.perf_counter()
    result = run_lab(LABS[lab_name], str(path))
    return time.perf_counter() - start, result.passed


def main(names: list[str]) -> int:
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    failed = 0
    for name in names or sorted(LABS):
        base = os.path.basename(LABS[name].student_file)
        solution_s, passed = timed(name, ROOT / "notebooks" / "solutions" / "labs" / base)
        stub_s, _ = timed(name, ROOT / "course" / "labs" / "stubs" / base)
        verdict = "PASS" if solution_s <= TARGET_S and passed else "FAIL"
        failed += verdict == "FAIL"
        print(f"{name:>12}: solution checked in {solution_s:5.1f} s ({len(LABS[name].runs)} runs; target <= "
              f"{TARGET_S:g} s) {verdict}{'' if passed else ' (the solution did not pass!)'}; stub {stub_s:5.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
