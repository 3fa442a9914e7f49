"""Speed target for course.collectives.allreduce: the ring keeps up with gloo's own allreduce at 16 MB and above.

Times naive, ring and tree against ``torch.distributed.all_reduce`` on 4 ranks (gloo on emulated GPUs) at
1, 16 and 64 MB, side by side in one run, and prints algbw, busbw (nccl-tests definitions) and each one's
throughput relative to ``dist.all_reduce``. Throughput as nccl-tests measures it: each timing is a few calls
back to back (``--calls``), seconds per call, slowest rank. The algorithms take turns within each round, in
an order that rotates, so a busy machine slows them alike; the ratio is the median over rounds of the ratio
within a round (a paired comparison: load that drifts between rounds cancels out), with a 95% bootstrap
interval for that median: on 2 cores shared by 4 ranks, rounds differ by ±20%, so a verdict near 1.0x says
how sure it is. ``ring`` is the default call, which checks on every call that all ranks pass the same shape
(a repeated call tells its right neighbour, moves its data at once and checks at the end); ``ring
(check=False)`` skips that check, as DistributedOptimizer does after verifying its buckets once.
``--calls 1`` times a call that starts cold instead (every rank idle until it): on 2 shared cores that adds
a few ms of waking up to every algorithm alike.
Run: ``python benchmarks/allreduce.py``. Exit status 1 if the ring is below 1.0x at 16 MB or more, or naive
is not slower than the ring at 64 MB.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import numpy as np
import torch.distributed as dist

from course import timing
from course.collectives import cost_model
from course.collectives import timing_ranks as allreduce_timing
from course.collectives.allreduce import naive_allreduce, ring_allreduce, tree_allreduce
from course.runtime.launch import launch

MB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=21, help="rounds: timings per size and algorithm")
    parser.add_argument("--calls", type=int, default=5, help="allreduces back to back per timing")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    algorithms = {
        allreduce_timing.REFERENCE: dist.all_reduce, "naive": naive_allreduce, "ring": ring_allreduce,
        "ring (check=False)": partial(ring_allreduce, check=False), "tree": tree_allreduce,
    }
    sizes = [mb * MB for mb in args.sizes_mb]
    rounds = launch(allreduce_timing.time_allreduce, args.world_size, sizes, algorithms, args.repeats, samples=True,
                    calls=args.calls, timeout_s=1200)[0]
    times = {name: {size: float(np.median(r)) for size, r in by_size.items()} for name, by_size in rounds.items()}

    def ratios(name: str, size: int) -> np.ndarray:
        """Per round, reference time / this algorithm's time (> 1: faster than the reference)."""
        return np.array(rounds[allreduce_timing.REFERENCE][size]) / np.array(rounds[name][size])

    def ratio(name: str, size: int) -> float:
        return float(np.median(ratios(name, size)))

    def bootstrap(name: str, size: int) -> tuple[float, float]:
        """95% bootstrap interval of the median ratio (rounds resampled with replacement, fixed seed)."""
        estimate = timing.summarize(ratios(name, size))
        return estimate.low, estimate.high

    intervals = {(name, size): bootstrap(name, size) for name in algorithms for size in sizes}

    n = args.world_size
    print(f"allreduce of float32 tensors on {n} ranks, {args.repeats} rounds of {args.calls} calls back to back "
          "(algorithms take turns in each round)")
    print(f"{'size':>6}  {'algorithm':<20}{'median ms':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}{'vs reference':>14}"
          f"{'95% interval':>15}")
    for size in sizes:
        for name in algorithms:
            seconds = times[name][size]
            low, high = intervals[name, size]
            print(f"{size // MB:>4}MB  {name:<20}{seconds * 1e3:>10.1f}{cost_model.algbw(size, seconds) / 1e9:>12.3f}"
                  f"{cost_model.busbw(size, seconds, n) / 1e9:>12.3f}{ratio(name, size):>13.2f}x"
                  f"{low:>9.2f}-{high:.2f}")
    big = [s for s in sizes if s >= 16 * MB]
    for name in ("ring", "ring (check=False)"):
        values = [ratio(name, s) for s in big]
        verdict = "PASS" if values and min(values) >= 1.0 else "FAIL"
        shown = ", ".join(f"{s // MB} MB {ratio(name, s):.2f}x ({low:.2f}-{high:.2f})"
                          for s in big for low, high in [intervals[name, s]])
        unsure = [s for s in big if intervals[name, s][0] < 1.0 <= intervals[name, s][1]]
        note = f"; 1.0x is inside the interval at {', '.join(f'{s // MB} MB' for s in unsure)}" if unsure else ""
        print(f"{name} >= 1.0x {allreduce_timing.REFERENCE} at 16 MB and above: {verdict} ({shown}{note})")
    ring_ok = bool(big) and min(ratio("ring", s) for s in big) >= 1.0
    naive_slower = ratio("naive", max(sizes)) < ratio("ring", max(sizes))
    print(f"naive slower than ring at {max(sizes) // MB} MB: {'PASS' if naive_slower else 'FAIL'}")
    return 0 if ring_ok and naive_slower else 1


if __name__ == "__main__":
    sys.exit(main())
