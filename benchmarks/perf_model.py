"""Print the performance model against published figures: the calibration set, then every row labelled
calibration, arithmetic or prediction, with its signed error, and the prediction rows' bias beside the largest.

    .venv/bin/python benchmarks/perf_model.py

Everything printed is modelled (course.perf) or published (each row's source); nothing is timed here.
Exit status 1 if fewer than 12 prediction rows fall within ±20% or their bias leaves ±8%, the bounds
``tests/perf/test_published.py`` asserts.
"""

from __future__ import annotations

import sys

from course.perf import microbench, published

TOLERANCE, BIAS, ENOUGH = 0.20, 0.08, 12


def main() -> int:
    print("Calibration set (course.perf.microbench): each constant fitted once, or marked ASSUMED\n")
    print(microbench.format_figures())
    print("\nValidation (course.perf.published): defaults only, no per-row knob\n")
    rows = published.validation_table()
    print(published.format_table(rows))
    summary = published.summary(rows, TOLERANCE)
    ok = summary["within"] >= ENOUGH and abs(summary["bias"]) <= BIAS
    print(f"\n{'PASS' if ok else 'FAIL'}: need >= {ENOUGH} predictions within ±{TOLERANCE:.0%} "
          f"(got {summary['within']} of {summary['predictions']}) and a bias within ±{BIAS:.0%} "
          f"(got {summary['bias']:+.1%}); mean absolute error {summary['mae']:.1%}, largest {summary['largest']:+.0%}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
