"""Rank functions of benchmarks/observed_overhead.py (importable: launch's ranks unpickle them by module name)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from course.runtime import nccl_rules, observed


def _timed(group: object, calls: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per blocking all-reduce of 4 floats on ``group``."""
    tensor = torch.ones(4)
    dist.barrier(group=group)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        dist.all_reduce(tensor, group=group)
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


def per_call(calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) microseconds per call over ``rounds``, taking turns within each round: torch's own gloo,
    the observed group with agreement checked at sampled calls (as shipped), and checked at every call."""
    with observed.unobserved():
        plain = dist.new_group(list(range(dist.get_world_size())))
    found: dict[str, list[tuple[float, float]]] = {"torch's gloo": [], "observed, sampled": [],
                                                   "observed, every call": []}
    shipped = nccl_rules.CHECK_EVERY
    try:
        for _ in range(rounds):
            found["torch's gloo"].append(_timed(plain, calls))
            nccl_rules.CHECK_EVERY = shipped
            found["observed, sampled"].append(_timed(dist.group.WORLD, calls))
            nccl_rules.CHECK_EVERY = 1
            found["observed, every call"].append(_timed(dist.group.WORLD, calls))
    finally:
        nccl_rules.CHECK_EVERY = shipped
    return {name: (statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows))
            for name, rows in found.items()}
