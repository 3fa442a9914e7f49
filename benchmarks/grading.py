"""How long the grader takes for one submission, against a plain torchrun of the same script.

    python benchmarks/grading.py [SCRIPT [REPEATS]]   (default: the reference solution, 3 repeats)

Targets: grading one submission in at most 45 s on 2 cores, at most 1.3x a plain
``torchrun --standalone --nproc_per_node=4 SCRIPT`` (a free port). Both are measured here, one after the
other, on this machine (emulated GPUs on a CPU-only machine); the ratio is what the grader adds:
sandbox, probes, records, replay and the separate evaluation of the checkpoint.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.runner import grade

ROOT = Path(__file__).resolve().parent.parent
TARGET_S, TARGET_RATIO = 45.0, 1.3


def plain_torchrun(script: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(script, Path(tmp) / "train_4gpu.py")
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node=4", "train_4gpu.py"], cwd=tmp, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"plain torchrun failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
        return time.perf_counter() - start


def main() -> int:
    script = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "submissions" / "reference.py"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    plain, graded = [], []
    for _ in range(repeats):  # alternated, so both see the same background load; the best of each is kept
        plain.append(plain_torchrun(script))
        start = time.perf_counter()
        results = grade(script)
        graded.append(time.perf_counter() - start)
        print(f"  torchrun {plain[-1]:5.1f} s   grader {graded[-1]:5.1f} s   {results.status}: {results.detail[:300]}",
              flush=True)
    ratio = min(graded) / min(plain)
    print(f"plain torchrun --nproc_per_node=4: best {min(plain):6.1f} s of {repeats} (measured)")
    print(f"grader (sandbox + probes + eval):  best {min(graded):6.1f} s of {repeats} (measured), "
          f"score {results.score:g}/{results.max_score:g}, status {results.status}")
    print(f"ratio {ratio:.2f}x (target <= {TARGET_RATIO}x); per submission {min(graded):.1f} s "
          f"(target <= {TARGET_S:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
