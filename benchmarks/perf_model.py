"""Print the performance model's validation table: each published figure, what the model says, and the ratio.

    .venv/bin/python benchmarks/perf_model.py

Everything printed is modelled (course.perf.model) or published (each row's source); nothing is timed here.
Exit status 1 if any row's ratio leaves [0.85, 1.15], the tolerance ``tests/perf/test_published.py`` asserts.
"""

from __future__ import annotations

import sys

from course.perf import published

TOLERANCE = 0.15


def main() -> int:
    rows = published.validation_table()
    print(published.format_table(rows))
    outside = [row for row in rows if abs(row.ratio - 1) > TOLERANCE]
    worst = max(rows, key=lambda row: abs(row.ratio - 1))
    print(f"\n{len(rows)} published figures; largest deviation {abs(worst.ratio - 1):.0%} ({worst.claim}); "
          f"{len(outside)} outside ±{TOLERANCE:.0%}.")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
