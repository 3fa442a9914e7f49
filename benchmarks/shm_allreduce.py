"""Speed target for course.shm_allreduce: at least 3x gloo's all_reduce at 16 MB on 4 ranks, in the same run.

Times ``shm_allreduce`` (checked, and ``check=False``) against ``torch.distributed.all_reduce`` (gloo, through
loopback sockets) on 4 ranks of float32 tensors, side by side in one launch: the algorithms take turns
within each round in a rotating order, and the ratio is the median over rounds of the ratio within a round
(a paired comparison, with a 95% bootstrap interval), as ``benchmarks/allreduce.py`` does. Each timing is a
few calls back to back (``--calls``), seconds per call, slowest rank.

In the same run, every rank copies a tensor at the same time (``course.shm_allreduce.copy_bandwidth``):
this machine's memory copy bandwidth per rank, the physical limit of an allreduce through memory. The shared-
memory allreduce's bus bandwidth (nccl-tests' busbw) is printed as a fraction of it. That fraction is a
measurement, not a target: each call copies about 3 tensors per rank and adds n chunks, so busbw, which
counts 2(n-1)/n tensors, stays below the copy bandwidth.
Run: ``python benchmarks/shm_allreduce.py``. Exit status 1 if shm_allreduce is below 3x at 16 MB.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import numpy as np
import torch.distributed as dist

from course import cost_model
from course.runtime.launch import launch
from course.shm_allreduce import copy_bandwidth, shm_allreduce

MB = 1 << 20
TARGET = 3.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15, help="rounds: timings per size and algorithm")
    parser.add_argument("--calls", type=int, default=3, help="allreduces back to back per timing")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    algorithms = {cost_model.REFERENCE: dist.all_reduce, "shm": shm_allreduce,
                  "shm (check=False)": partial(shm_allreduce, check=False)}
    sizes = [mb * MB for mb in args.sizes_mb]
    copy = launch(copy_bandwidth, args.world_size, 4 * max(sizes), timeout_s=300)[0]
    rounds = launch(cost_model.time_allreduce, args.world_size, sizes, algorithms, args.repeats, samples=True,
                    calls=args.calls, timeout_s=1200)[0]
    n = args.world_size

    def ratios(name: str, size: int) -> np.ndarray:
        return np.array(rounds[cost_model.REFERENCE][size]) / np.array(rounds[name][size])

    def interval(name: str, size: int) -> tuple[float, float]:
        medians = np.median(np.random.default_rng(0).choice(ratios(name, size), (2000, args.repeats)), axis=1)
        low, high = np.percentile(medians, [2.5, 97.5])
        return float(low), float(high)

    print(f"allreduce of float32 tensors on {n} ranks, {args.repeats} rounds of {args.calls} calls back to back "
          "(algorithms take turns in each round)")
    print(f"memory copy bandwidth, all {n} ranks copying {4 * max(sizes) // MB} MB at once: {copy / 1e9:.2f} GB/s "
          "per rank (measured in this run)")
    print(f"{'size':>6}  {'algorithm':<19}{'median ms':>10}{'busbw GB/s':>12}{'busbw/copy':>12}{'vs reference':>14}"
          f"{'95% interval':>15}")
    for size in sizes:
        for name in algorithms:
            seconds = float(np.median(rounds[name][size]))
            bus = float(cost_model.busbw(size, seconds, n))
            low, high = interval(name, size)
            print(f"{size // MB:>4}MB  {name:<19}{seconds * 1e3:>10.1f}{bus / 1e9:>12.3f}{bus / copy:>11.0%} "
                  f"{float(np.median(ratios(name, size))):>12.2f}x{low:>9.2f}-{high:.2f}")
    passed = True
    for name in ("shm", "shm (check=False)"):
        at_16 = [s for s in sizes if s == 16 * MB]
        if not at_16:
            print(f"{name}: 16 MB not measured (--sizes-mb): no verdict")
            passed = False
            continue
        ratio, (low, high) = float(np.median(ratios(name, 16 * MB))), interval(name, 16 * MB)
        verdict = "PASS" if ratio >= TARGET else "FAIL"
        unsure = f"; {TARGET:g}x is inside the interval" if low < TARGET <= high else ""
        print(f"{name} >= {TARGET:g}x {cost_model.REFERENCE} at 16 MB on {n} ranks: {verdict} "
              f"({ratio:.2f}x, 95% interval {low:.2f}-{high:.2f}{unsure})")
        passed = passed and ratio >= TARGET
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
