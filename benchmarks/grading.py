"""How long the grader takes per submission, as an instructor grades a class: two at a time on this machine.

    python benchmarks/grading.py [SCRIPT [CLASS_SIZE]]   (default: the reference solution, a class of 4)

Targets, each printed next to what was measured here and judged PASS or FAIL:

* at most 45 s per submission while two are graded at once (``grader grade``'s default on 2 cores): the median
  of the submissions' own grading times, with the slowest and the class's wall time per submission beside it.
  issue 12 reported 40-60 s on a loaded 2-core machine (a class of 27 in 478 s), over the target;
* at most 1.3x a plain ``torchrun --standalone --nproc_per_node=4 SCRIPT`` of the same script, one at a time,
  both measured here, alternated so that both see the same background load: what the grader adds (sandbox,
  probes, records, replay, the separate evaluation of the checkpoint).

Every number is measured on this machine (emulated GPUs on its CPU), under whatever else runs on it: the
load average is printed with them. Expensive (about 3 + CLASS_SIZE / 2 four-rank runs): run it by hand.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.cli import grade_class
from grader.runner import grade

ROOT = Path(__file__).resolve().parent.parent
TARGET_S, TARGET_RATIO, JOBS = 45.0, 1.3, 2


def plain_torchrun(script: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(script, Path(tmp) / "train_4gpu.py")
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node=4", "train_4gpu.py"], cwd=tmp, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"plain torchrun failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
        return time.perf_counter() - start


def overhead(script: Path, repeats: int = 2) -> tuple[float, float]:
    """Median seconds of a plain torchrun and of one grading (alone), alternated ``repeats`` times."""
    plain, graded = [], []
    for _ in range(repeats):
        plain.append(plain_torchrun(script))
        start = time.perf_counter()
        results = grade(script)
        graded.append(time.perf_counter() - start)
        print(f"  alone: torchrun {plain[-1]:5.1f} s   grader {graded[-1]:5.1f} s   {results.status}", flush=True)
    return statistics.median(plain), statistics.median(graded)


def a_class(script: Path, size: int) -> tuple[list[float], float, list[str]]:
    """Grade ``size`` copies of ``script`` ``JOBS`` at a time, as ``grader grade -j 2`` does.

    Returns each submission's own grading time, the class's wall time, and each submission's status.
    """
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        for i in range(size):
            shutil.copyfile(script, folder / f"student{i:02d}.py")
        start = time.perf_counter()
        results = grade_class(folder, Path(tmp) / "out", jobs=JOBS, progress=False)
        wall = time.perf_counter() - start
    for r in results:
        print(f"  {JOBS} at a time: {r.submission} {r.elapsed_s:5.1f} s   {r.status}", flush=True)
    return [r.elapsed_s for r in results], wall, [r.status for r in results]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> int:
    script = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "submissions" / "reference.py"
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    load_before = os.getloadavg()[0]
    plain, alone = overhead(script)
    each, wall, statuses = a_class(script, size)
    per_submission = statistics.median(each)
    ratio = alone / plain
    print(f"machine: {os.cpu_count()} CPU(s), load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
          "(measured, with whatever else ran meanwhile)")
    print(f"graded {JOBS} at a time, a class of {size}: median {per_submission:.1f} s per submission, slowest "
          f"{max(each):.1f} s, class wall time {wall:.1f} s = {wall / size:.1f} s per submission (measured); "
          f"target <= {TARGET_S:g} s per submission: {verdict(per_submission <= TARGET_S)}")
    print(f"one at a time: grader {alone:.1f} s against plain torchrun {plain:.1f} s (medians, measured): "
          f"{ratio:.2f}x; target <= {TARGET_RATIO}x: {verdict(ratio <= TARGET_RATIO)}")
    graded_ok = all(s == "ok" for s in statuses)
    if not graded_ok:
        print(f"the class was not graded cleanly ({', '.join(sorted(set(statuses)))}): its times do not count: FAIL")
    return 0 if graded_ok and per_submission <= TARGET_S and ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
