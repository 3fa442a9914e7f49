"""What the observation layer costs per call (course.runtime.observed), and what checking NCCL's agreement rule at
every call would add to it: a measurement, not a target.

On 2 ranks, blocking all-reduces of 4 floats (the cost is per call, not per byte) on torch's own gloo, on the
observed group as shipped (agreement compared through the store at a rank's 1st, 2nd, 4th, ... 64th collective,
then every 64th), and on the observed group comparing at every call. Prints, per rank, the median over rounds of
wall and CPU microseconds per call. On 2 loaded cores (load 26) rank 0 read: gloo 1578 us wall / 597 us CPU,
sampled 2765 / 960, every call 3434 / 1412; so every call's store round trips would add about half the layer's cost
again, which is why the rule samples and compares a running hash instead (tests/runtime/test_nccl_rules.py).
Run: ``python benchmarks/observed_overhead.py [--calls 2000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os

from observed_overhead_ranks import per_call

from course.runtime.launch import launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="all-reduces per timing")
    parser.add_argument("--rounds", type=int, default=3, help="timings of each kind, taking turns")
    args = parser.parse_args()
    for rank, found in enumerate(launch(per_call, 2, args.calls, args.rounds, timeout_s=900)):
        print(f"rank {rank}: " + "; ".join(f"{name} {wall:.0f} us wall, {cpu:.0f} us CPU per call"
                                           for name, (wall, cpu) in found.items()))
    print(f"load average now: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
