"""benchmarks/labs.py: the count of lines a student writes, on sources built by hand and on the labs themselves."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import labs  # noqa: E402 - benchmarks/ is not a package

STUB = '''"""A lab."""


def f(x):
    """Double x."""
    raise NotImplementedError("write f")
'''
SOLUTION = '''"""A lab."""


def f(x):
    """Double x."""
    # the comment does not count, nor the blank line

    y = x + x
    return y
'''


def test_only_the_code_the_solution_adds_counts():
    assert labs.code_lines(SOLUTION) == ["def f(x):", "y = x + x", "return y"]
    assert labs.student_lines(STUB, SOLUTION) == 2  # the raise is replaced by two lines
    assert labs.student_lines(SOLUTION, SOLUTION) == 0
    assert labs.student_lines('STUDENT_ID = ""\n' + STUB, 'STUDENT_ID = "me"\n' + SOLUTION) == 2  # an id is no code


def test_the_labs_ask_for_at_least_the_target_across_them():
    counts = labs.lines_per_lab()
    assert {"one_f_one_b", "fsdp", "ring"} <= set(counts)  # by lab name
    assert sum(counts.values()) >= labs.TARGET_LINES, counts
