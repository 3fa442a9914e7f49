"""Rank functions for tests/collectives/test_shm_allreduce.py (and test_hierarchical.py): many checks in ONE launch.

Every subset size k = 1..world_size is a process group of ranks 0..k-1, as in ``allreduce_ranks``, so one
4-rank launch tests world sizes 1-4 (the group argument with them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from allreduce_ranks import DTYPES, TOLERANCE, _data, _groups
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import course.collectives.shm_group as shm
from course import world
from course.collectives.hierarchical import hierarchical_allreduce, node_groups
from course.collectives.shm_allreduce import shm_allreduce
from course.collectives.shm_group import SHM_DIR


@st.composite
def cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    """One allreduce to check: group size, shape, dtype, op, values."""
    k = draw(st.integers(1, world_size))
    numel = draw(st.one_of(st.integers(0, 2 * k + 1), st.integers(0, 70_000),
                           st.tuples(st.integers(1, 40), st.integers(-1, 1)).map(lambda mj: mj[0] * k + mj[1])))
    shape = draw(st.sampled_from([(numel,), (1, numel), (numel, 1)] + ([(2, numel // 2)] if numel % 2 == 0 else [])))
    return {"k": k, "shape": shape, "dtype": draw(st.sampled_from(sorted(DTYPES))),
            "op": draw(st.sampled_from(["sum", "avg"])), "values": draw(st.sampled_from(["integers", "normal"])),
            "check": draw(st.booleans()), "seed": draw(st.integers(0, 2**31 - 1))}


def one_case(allreduce: Callable[..., torch.Tensor], case: dict[str, Any], group: dist.ProcessGroup | None
             ) -> str | None:
    """Run ``case`` with ``allreduce`` on ranks 0..k-1 (``group``); what went wrong on this rank, or None."""
    rank, k = world.current().rank, case["k"]
    if rank >= k:
        return None
    expected = _data(case, rank)
    dist.all_reduce(expected, group=group)
    if case["op"] == "avg":
        expected.div_(k)
    for call in ("", " (repeated)"):
        mine = _data(case, rank)
        address = mine.data_ptr()
        got = allreduce(mine, op=case["op"], group=group, check=case["check"], **case.get("options", {}))
        if got is not mine or mine.data_ptr() != address or mine.shape != expected.shape:
            return f"not in place{call}"
        if case["values"] == "integers":
            close = torch.equal(mine, expected)
        else:
            tol = TOLERANCE[case["dtype"]]
            close = torch.allclose(mine.double(), expected.double(), rtol=tol, atol=tol * k)
        if not close:
            return f"differs from dist.all_reduce by up to {(mine.double() - expected.double()).abs().max():g}{call}"
    return None


@st.composite
def hierarchical_cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    """A case for hierarchical_allreduce: also how many ranks per node, and the algorithm across nodes."""
    case = draw(cases(world_size))
    per_node = draw(st.sampled_from([d for d in range(1, case["k"] + 1) if case["k"] % d == 0]))
    return {**case, "options": {"ranks_per_node": per_node, "across": draw(st.sampled_from(["ring", "tree"]))}}


def hypothesis_cases(allreduce: Callable[..., torch.Tensor], max_examples: int,
                     groups: dict[int, dist.ProcessGroup | None], strategy: Callable = cases) -> dict[str, Any]:
    """Rank 0 draws cases and broadcasts each; every rank runs it. On rank 0: count, covered k, failures."""
    me = world.current()
    if me.rank != 0:
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                return {}
            dist.gather_object(one_case(allreduce, box[0], groups[box[0]["k"]]), None, dst=0)
    report: dict[str, Any] = {"count": 0, "covered": set(), "failures": []}

    @settings(max_examples=max_examples, database=None, deadline=None, derandomize=True,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(case=strategy(me.world_size))
    @example(case={"k": 4, "shape": (0,), "dtype": "float32", "op": "avg", "values": "normal", "check": True,
                   "seed": 0, **({"options": {"ranks_per_node": 2}} if strategy is hierarchical_cases else {})})
    @example(case={"k": 3, "shape": (1,), "dtype": "bfloat16", "op": "sum", "values": "integers", "check": False,
                   "seed": 1, **({"options": {"ranks_per_node": 1}} if strategy is hierarchical_cases else {})})
    def drive(case: dict[str, Any]) -> None:
        dist.broadcast_object_list([case], src=0)
        problems: list[str | None] = [None] * me.world_size
        dist.gather_object(one_case(allreduce, case, groups[case["k"]]), problems, dst=0)
        report["count"] += 1
        report["covered"].add((case["k"], case.get("options", {}).get("ranks_per_node")))
        found = {rank: why for rank, why in enumerate(problems) if why}
        if found:
            report["failures"].append((case, found))

    try:
        drive()
    finally:
        dist.broadcast_object_list([None], src=0)
    return report


def mismatches(bad_rank: int) -> dict[str, str]:
    """One rank disagrees (numel, shape, dtype, op): the error this rank raised, then whether the next, agreed
    call is right (the group is still usable)."""
    rank = world.current().rank
    variants = {"numel": dict(shape=(6, 5)), "shape": dict(shape=(4, 6)), "dtype": dict(dtype=torch.float64),
                "op": dict(op="avg")}
    errors = {}
    for what, change in variants.items():
        mine = {"shape": (6, 4), "dtype": torch.float32, "op": "sum"}
        if rank == bad_rank:
            mine.update(change)
        try:
            shm_allreduce(torch.ones(mine["shape"], dtype=mine["dtype"]), op=mine["op"])
            errors[what] = "no error"
        except ValueError as error:
            errors[what] = str(error)
        after = shm_allreduce(torch.full((7,), float(rank)))
        errors[f"{what}, next call right"] = bool(torch.all(after == sum(range(world.current().world_size))))
    return errors


def different_hosts() -> str:
    """A new group whose ranks claim different hosts: the error this rank raised."""
    rank = world.current().rank
    group = dist.new_group(list(range(world.current().world_size)))
    real = shm.host
    shm.host = lambda: f"host{rank % 2}"
    try:
        shm_allreduce(torch.ones(3), group=group)
        return "no error"
    except ValueError as error:
        return str(error)
    finally:
        shm.host = real


def growing(sizes: tuple[int, ...] = (10, 100_000, 5, 3_000_000, 100_000)) -> list[bool]:
    """Calls whose tensors grow past the mapped capacity and shrink back: each sum exact."""
    me = world.current()
    results = []
    for numel in sizes:
        tensor = torch.full((numel,), float(me.rank + 1))
        results.append(bool(torch.all(shm_allreduce(tensor) == me.world_size * (me.world_size + 1) / 2)))
    return results


def late_rank(late: int) -> dict[str, bool]:
    """Rank ``late`` starts its call 0.2 s after the others, who wait at the barrier sleeping on a futex, then
    again with futexes switched off (they poll): is each sum exact?"""
    me = world.current()
    results = {}
    for mode in ("futex", "polling"):
        saved = shm._libc
        if mode == "polling":
            shm._libc = None
        try:
            if me.rank == late:
                time.sleep(0.2)
            tensor = torch.full((1000,), float(me.rank + 1))
            results[mode] = bool(torch.all(shm_allreduce(tensor) == me.world_size * (me.world_size + 1) / 2))
        finally:
            shm._libc = saved
    return results


def our_files() -> list[str]:
    """This run's files still in /dev/shm (each is unlinked once every rank has mapped it)."""
    prefixes = {shared.name for shared in shm._groups.values()}
    return sorted(name for name in os.listdir(SHM_DIR) if any(name.startswith(p) for p in prefixes))


def hierarchical_mismatches(bad_rank: int, ranks_per_node: int = 2) -> dict[str, str]:
    """hierarchical_allreduce with one rank's numel different (a leader, or not): the error each rank raised, and
    whether the next, agreed call is right."""
    me = world.current()
    errors: dict[str, Any] = {}
    for who in (bad_rank, bad_rank + 1):
        label = "leader" if who % ranks_per_node == 0 else "not a leader"
        try:
            hierarchical_allreduce(torch.ones(6 if me.rank == who else 5), ranks_per_node=ranks_per_node)
            errors[label] = "no error"
        except ValueError as error:
            errors[label] = str(error)
        after = hierarchical_allreduce(torch.full((7,), float(me.rank)), ranks_per_node=ranks_per_node)
        errors[f"{label}, next call right"] = bool(torch.all(after == sum(range(me.world_size))))
    return errors


def hierarchical(max_examples: int, bad_rank: int) -> dict[str, Any]:
    """The hierarchical checks in one launch."""
    size = world.current().world_size
    groups = _groups(size)
    for k in range(1, size + 1):  # every rank makes every sub-group's node groups, in the same order
        for per_node in (d for d in range(1, k + 1) if k % d == 0):
            node_groups(per_node, range(k))
    return {"hypothesis": hypothesis_cases(hierarchical_allreduce, max_examples, groups, hierarchical_cases),
            "mismatches": hierarchical_mismatches(bad_rank)}


def everything(max_examples: int, bad_rank: int) -> dict[str, Any]:
    """All of the above in one launch."""
    groups = _groups(world.current().world_size)
    return {"hypothesis": hypothesis_cases(shm_allreduce, max_examples, groups), "mismatches": mismatches(bad_rank),
            "growing": growing(), "late_rank": late_rank(bad_rank), "different_hosts": different_hosts(),
            "files": our_files()}
