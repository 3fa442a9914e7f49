"""How long checking one lab takes: each registered lab's visible check on its reference solution, and the stub.

    python benchmarks/labs.py [LAB ...]    (default: every lab in grader.labs.LABS)
    python benchmarks/labs.py --lines      (only how many lines a student writes, per lab and in all)

Target (issue 22): at most 30 s for one lab's visible check (what the notebook's check cell and ``grader check``
run), printed next to what was measured here and judged PASS or FAIL; the stub's check (one run, stopped as soon
as it is found in place) beside it, since that is what a notebook runs under nbval. Measured on this machine
(emulated GPUs on its CPU) under whatever else runs on it: the load average is printed with them, and on a
loaded machine a FAIL may say more about the load than about the lab. The grader's hidden runs are not timed.

First it prints how much code a student writes (issue 34: at least 300 lines across the labs): for each lab, the
lines of its reference solution (``grader/labs/<lab>/reference.py``) that are not in its stub (``stub.py``), matched
line by line with ``difflib``, counting neither blank lines, comments, docstrings nor the ``STUDENT_ID`` line.
"""

from __future__ import annotations

import ast
import difflib
import os
import sys
import time
from pathlib import Path

from grader.labs import LABS, run_lab
from grader.labs.core import reference_path, stub_path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 30.0
TARGET_LINES = 300  # lines of code a student writes across the labs
ID_LINE = "STUDENT_ID ="  # the student's id (grader.labs.variant): typed, not written, so not counted


def code_lines(source: str) -> list[str]:
    """The stripped lines of ``source`` that are code: no blank line, comment or docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return [line.strip() for number, line in enumerate(source.splitlines(), start=1)
            if line.strip() and not line.strip().startswith(("#", ID_LINE)) and number not in docstrings]


def student_lines(stub: str, solution: str) -> int:
    """Code lines of ``solution`` that ``stub`` does not have (inserted or replaced, as difflib matches them)."""
    matcher = difflib.SequenceMatcher(None, code_lines(stub), code_lines(solution), autojunk=False)
    return sum(j2 - j1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert"))


def lines_per_lab() -> dict[str, int]:
    """Lines a student writes in each lab whose stub and solution are both in the repository, by file name."""
    counts = {}
    for name, lab in LABS.items():
        stub, solution = stub_path(lab), reference_path(lab)
        if stub.is_file() and solution.is_file():
            counts[name] = student_lines(stub.read_text(), solution.read_text())
    return counts


def print_lines() -> int:
    counts = lines_per_lab()
    for name, count in counts.items():
        print(f"{name:>18}: {count:4d} lines written by the student")
    total = sum(counts.values())
    verdict = "PASS" if total >= TARGET_LINES else "FAIL"
    print(f"{'in all':>18}: {total:4d} lines (target >= {TARGET_LINES}) {verdict}")
    return 0 if total >= TARGET_LINES else 1


def timed(lab_name: str, path: Path) -> tuple[float, bool]:
    start = time.perf_counter()
    result = run_lab(LABS[lab_name], str(path))
    return time.perf_counter() - start, result.passed


def main(names: list[str]) -> int:
    if names == ["--lines"]:
        return print_lines()
    failed = print_lines()  # 1 if the labs ask for fewer lines than TARGET_LINES
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    for name in names or sorted(LABS):
        solution_s, passed = timed(name, reference_path(LABS[name]))
        stub_s, _ = timed(name, stub_path(LABS[name]))
        verdict = "PASS" if solution_s <= TARGET_S and passed else "FAIL"
        failed += verdict == "FAIL"
        print(f"{name:>12}: solution checked in {solution_s:5.1f} s ({len(LABS[name].runs)} runs; target <= "
              f"{TARGET_S:g} s) {verdict}{'' if passed else ' (the solution did not pass!)'}; stub {stub_s:5.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
