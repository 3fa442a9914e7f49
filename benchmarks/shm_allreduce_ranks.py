"""Rank functions for benchmarks/shm_allreduce.py (importable: ``course.runtime.launch`` starts each rank afresh).

:func:`time_rounds` times each algorithm in turn within a round (the order rotating from round to round), wall
seconds of the slowest rank and CPU seconds summed over ranks; :func:`time_phases` times the five steps of
``course.collectives.shm_allreduce.shm_allreduce`` one by one on every rank, from the module's own step functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

import course.collectives.shm_allreduce as shm
from course import world
from course.collectives import shm_group

PHASES = ("copy in", "barrier 1", "reduce", "barrier 2", "copy out")


def _gather(values: list[float]) -> torch.Tensor:
    """(world_size, len(values)) float64: every rank's values, on every rank."""
    mine = torch.tensor(values, dtype=torch.float64)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return torch.stack(rows)


def time_rounds(nbytes: int, algorithms: Mapping[str, Callable[[torch.Tensor], object]], rounds: int,
                calls: int) -> dict[str, dict[str, list[float]]]:
    """Per algorithm and round: ``wall`` (slowest rank's seconds per call) and ``cpu`` (CPU seconds per call
    of all ranks together, every thread of each process: gloo's own threads count), plus ``threads`` (torch
    intra-op threads per rank). ``calls`` allreduces back to back per timing."""
    tensor = torch.empty(nbytes // 4, dtype=torch.float32)
    names = list(algorithms)
    results: dict = {name: {"wall": [], "cpu": []} for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            tensor.fill_(world.current().rank)
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                algorithms[name](tensor)
            both = _gather([(time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls])
            results[name]["wall"].append(both[:, 0].max().item())
            results[name]["cpu"].append(both[:, 1].sum().item())
    results["threads"] = [int(t) for t in _gather([torch.get_num_threads()])[:, 0].tolist()]
    return results


def time_phases(nbytes: int, repeats: int) -> dict[str, list[list[float]]]:
    """Wall seconds of each step of ``shm_allreduce`` (``PHASES``), per repeat, for every rank:
    ``{phase: [[rank 0's repeats], [rank 1's], ...]}``. A barrier's time is the wait for the slowest rank."""
    tensor = torch.full((nbytes // 4,), float(world.current().rank))
    shm.shm_allreduce(tensor)  # maps the shared memory
    shared, flat = shm_group.shared_group(None), tensor.view(-1)
    steps = (lambda: shm._copy_in(shared, flat), shared.barrier, lambda: shm._reduce_my_chunk(shared, flat),
             shared.barrier, lambda: shm._copy_out(shared, flat, "sum"))
    seconds: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(repeats):
        dist.barrier()
        for phase, step in zip(PHASES, steps, strict=True):
            start = time.perf_counter()
            step()
            seconds[phase].append(time.perf_counter() - start)
    return {phase: _gather(values).tolist() for phase, values in seconds.items()}
