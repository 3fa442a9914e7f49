"""Timing allreduces on this machine: every rank starts together, the slowest rank's time counts.

An allreduce is finished when the last rank has the sum, so a timing starts every rank at a barrier and keeps
the slowest rank's time (:func:`time_allreduce`). Algorithms take turns within each round, in an order that
rotates, so a noisy neighbour slows them all alike. :func:`ping_pong` times one link alone (half a round trip
between two ranks): the ``α + N·β`` that :func:`course.collectives.cost_model.fit` fits. :func:`measure` runs both,
and the
check against ``dist.all_reduce``, in one launch (starting ranks is the slow part)::

    report = launch(allreduce_timing.measure, 4, [4096, 1 << 20], 7, samples=True)[0]
    link = cost_model.fit(sizes, [timing.summarize(report["ping_pong"][n]).median for n in sizes])

The rank functions run on every rank (start them with ``course.runtime.launch.launch``) and return the same
result on every rank. :func:`measured_crossover` reads two measured curves alone, no model: where the faster
one changes. Everything the model says about these numbers is in :mod:`course.collectives.cost_model`; medians and
intervals of repeats are in :mod:`course.timing`. Taught in ``notebooks/04_allreduce.ipynb`` and
``notebooks/05b_nodes.ipynb``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from course import world
from course.collectives.allreduce import ALGORITHMS

#: Name under which measurements list the backend's own ``dist.all_reduce`` (gloo here, nccl on GPUs).
REFERENCE = "dist.all_reduce"


def _time_per_call(fn: Callable[[torch.Tensor], object], tensor: torch.Tensor, calls: int = 1) -> float:
    """The slowest rank's time per call for ``calls`` calls of ``fn(tensor)`` back to back, all ranks starting
    together."""
    tensor.fill_(world.current().rank)  # fresh values each time: repeated sums would overflow float16
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn(tensor)
    elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64, device=tensor.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def time_allreduce(nbytes: Sequence[int],
                   algorithms: Sequence[str] | Mapping[str, Callable] = (*ALGORITHMS, REFERENCE),
                   repeats: int = 5, *, samples: bool = False, calls: int = 1) -> dict[str, dict[int, Any]]:
    """Median seconds per allreduce of float32 tensors of each size, for each algorithm (on every rank).

    Algorithms take turns within each repeat, so a noisy neighbour slows them all alike (ratios between
    them are fairer than absolute times, and ratios within one round fairer still); the order rotates from
    round to round, so none always follows the same one (a predecessor can leave memory or caches busy).

    Args:
        nbytes: tensor sizes in bytes.
        algorithms: names from ``ALGORITHMS`` or ``REFERENCE`` (the backend's ``dist.all_reduce``), or a
            ``{label: fn(tensor)}`` mapping of picklable functions, e.g. ``functools.partial(ring_allreduce,
            check=False)``.
        repeats: timings (rounds) per size and algorithm; the median is kept.
        samples: return every round's time instead of the median (round ``i`` of every algorithm ran
            back to back, for paired comparisons).
        calls: allreduces back to back per timing, which reports seconds per call: 1 times a call that
            starts cold (every rank idle until it), more times the throughput of a stream of calls, as a
            training step's buckets make and as nccl-tests measures (keep it small: the values grow by
            the world size each call).

    Returns:
        ``{label: {nbytes: seconds}}`` (or ``{label: {nbytes: [seconds per round]}}``), the same on every rank.
    """
    if not isinstance(algorithms, Mapping):
        algorithms = {name: dist.all_reduce if name == REFERENCE else ALGORITHMS[name] for name in algorithms}
    results: dict = {name: {} for name in algorithms}
    for size in nbytes:
        tensor = torch.empty(size // 4, dtype=torch.float32, device=world.current().device)
        rounds: dict[str, list[float]] = {name: [] for name in algorithms}
        names = list(algorithms)
        for round_ in range(repeats):
            shift = round_ % len(names)  # each round starts with the next one: no algorithm always runs first
            for name in names[shift:] + names[:shift]:
                rounds[name].append(_time_per_call(algorithms[name], tensor, calls))
        for name in algorithms:
            results[name][size] = list(rounds[name]) if samples else float(np.median(rounds[name]))
    return results


def ping_pong(nbytes: Sequence[int], repeats: int = 5, *, samples: bool = False,
              between: tuple[int, int] = (0, 1)) -> dict[int, Any]:
    """One-way time of a message between two ranks (half a round trip), median of ``repeats``.

    Other ranks wait at the barrier. This is the ``α + N·β`` of one link, the input
    :func:`course.collectives.cost_model.fit` expects.

    Args:
        nbytes: message sizes in bytes. repeats: timed round trips per size (one more, untimed, connects).
        samples: return every repeat's time instead of the median (for :func:`course.timing.summarize`).
        between: the two global ranks at the ends of the link, e.g. two nodes' leaders.

    Returns:
        ``{nbytes: seconds}`` (or ``{nbytes: [seconds per repeat]}``), the same on every rank.

    Raises:
        ValueError: fewer than 2 ranks, or ``between`` not two different ranks of this world.
    """
    me = world.current()
    if me.world_size < 2:
        raise ValueError(f"ping_pong needs at least 2 ranks, got world_size={me.world_size}.")
    first, second = between
    if first == second or not {first, second} <= set(range(me.world_size)):
        raise ValueError(f"between must be two different ranks in 0..{me.world_size - 1}, got {between!r}.")
    results = {}
    for size in nbytes:
        tensor = torch.zeros(size // 4, dtype=torch.float32, device=me.device)
        times = []
        for _ in range(repeats + 1):  # the first round trip also sets up the connection: not timed
            dist.barrier()
            start = time.perf_counter()
            if me.rank == first:
                dist.send(tensor, second)
                dist.recv(tensor, second)
            elif me.rank == second:
                dist.recv(tensor, first)
                dist.send(tensor, first)
            times.append((time.perf_counter() - start) / 2)
        results[size] = times[1:] if samples else float(np.median(times[1:]))
    box = [results]
    dist.broadcast_object_list(box, src=first)
    return box[0]


def measure(nbytes: Sequence[int], repeats: int = 5, compare_numel: int = 0, *, samples: bool = False) -> dict:
    """Everything notebook 04 runs on several ranks, in one launch (starting ranks is the slow part).

    Args:
        nbytes: sizes for the ping-pong and allreduce timings. repeats: timings per size (median kept, or
            every one with ``samples=True``: then each ``s`` below is a list of seconds).
        compare_numel: if positive, also check every algorithm against ``dist.all_reduce`` on a tensor of
            this many elements (:func:`course.collectives.allreduce.compare_with_reference`).

    Returns:
        ``{"world_size": n, "ping_pong": {nbytes: s}, "allreduce": {algorithm: {nbytes: s}},
        "differences": {algorithm: largest difference from dist.all_reduce on this rank}}``.
    """
    from course.collectives.allreduce import compare_with_reference

    return {"world_size": world.current().world_size,
            "differences": compare_with_reference(compare_numel) if compare_numel > 0 else {},
            "ping_pong": ping_pong(nbytes, repeats, samples=samples),
            "allreduce": time_allreduce(nbytes, repeats=repeats, samples=samples)}


def measured_crossover(nbytes: Sequence[float], small: Sequence[float], large: Sequence[float]) -> float | None:
    """Where measured times of ``large`` first drop below those of ``small``, interpolated on log axes.

    The measured counterpart of :func:`course.collectives.cost_model.crossover`.

    Args:
        nbytes: increasing sizes; ``small``/``large``: the two algorithms' times at those sizes.

    Returns:
        The size in bytes, or None if ``large`` is never faster, or is faster already at the smallest size.
    """
    sizes, gap = np.log(np.asarray(nbytes, dtype=float)), np.log(np.asarray(large) / np.asarray(small))
    for i in range(1, len(sizes)):
        if gap[i - 1] > 0 >= gap[i]:
            return float(np.exp(sizes[i - 1] + (sizes[i] - sizes[i - 1]) * gap[i - 1] / (gap[i - 1] - gap[i])))
    return None
