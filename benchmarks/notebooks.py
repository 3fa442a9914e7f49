"""Time every notebook top to bottom and compare it with the course's budget of 60 s on 2 cores.

    .venv/bin/python benchmarks/notebooks.py [notebooks/NN_name.ipynb ...]

Prints, per notebook, the wall time of a full execution and its ratio to the budget (ratio <= 1.0 meets it);
exit status 1 if any notebook is over budget.
Run it on a quiet machine: the budget is about a student's laptop, not a loaded CI box.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

BUDGET_S = 60.0
ROOT = Path(__file__).resolve().parent.parent


def time_notebook(path: Path) -> float:
    """Seconds to execute ``path`` in a fresh kernel (kernel start-up included, as a student would see it)."""
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    # The kernel's own stderr is only start-up chatter (cell errors arrive as messages, and raise here).
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute(stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(paths: list[str]) -> int:
    notebooks = [Path(p) for p in paths] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    print(f"{'notebook':<36}{'seconds':>9}{'/ budget':>10}")
    worst = 0.0
    for path in notebooks:
        seconds = time_notebook(path)
        worst = max(worst, seconds / BUDGET_S)
        print(f"{path.name:<36}{seconds:>9.1f}{seconds / BUDGET_S:>9.2f}x", flush=True)
    print(f"worst ratio to the {BUDGET_S:.0f} s budget: {worst:.2f}x ({'met' if worst <= 1 else 'NOT met'})")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
