"""Rank functions for tests/collectives/test_allreduce.py: many checks inside ONE launch, since starting ranks is slow.

Every subset size k = 1..world_size is a process group of ranks 0..k-1 (``dist.new_group``), so one
8-rank launch tests every world size from 1 to 8, and the ``group`` argument with it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import course.collectives.allreduce
import course.collectives.protocol
from course import world
from course.collectives.allreduce import ALGORITHMS, compare_with_reference

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
# For random normal values: how far the sum may drift from gloo's, which adds in another order.
TOLERANCE = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-5, "float64": 1e-12}


@st.composite
def cases(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    """One allreduce to check: algorithm, group size, shape, dtype, op, values."""
    k = draw(st.integers(1, world_size))
    numel = draw(st.one_of(
        st.integers(0, 2 * k + 1),                       # fewer elements than ranks, one, zero
        st.integers(0, 5000),
        st.tuples(st.integers(1, 40), st.integers(-1, 1)).map(lambda mj: mj[0] * k + mj[1]),  # near chunk edges
    ))
    shape = draw(st.sampled_from([(numel,), (1, numel), (numel, 1)] + ([(2, numel // 2)] if numel % 2 == 0 else [])))
    return {
        "algorithm": draw(st.sampled_from(sorted(ALGORITHMS))),
        "k": k,
        "shape": shape,
        "dtype": draw(st.sampled_from(sorted(DTYPES))),
        "op": draw(st.sampled_from(["sum", "avg"])),
        "values": draw(st.sampled_from(["integers", "normal"])),  # integers: every order of adding is exact
        "check": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _groups(world_size: int) -> dict[int, dist.ProcessGroup | None]:
    """Process group of ranks 0..k-1 for every k (every rank must create every group, in the same order)."""
    groups: dict[int, dist.ProcessGroup | None] = {k: dist.new_group(list(range(k))) for k in range(1, world_size)}
    groups[world_size] = None
    return groups


def _data(case: dict[str, Any], rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(case["seed"] * 64 + rank)
    if case["values"] == "integers":
        values = torch.randint(-8, 9, case["shape"], generator=generator).double()
    else:
        values = torch.randn(case["shape"], generator=generator, dtype=torch.float64)
    return values.to(DTYPES[case["dtype"]])


def one_case(case: dict[str, Any], groups: dict[int, dist.ProcessGroup | None]) -> str | None:
    """Run ``case`` on ranks 0..k-1; return what went wrong on this rank, or None."""
    rank, k = world.current().rank, case["k"]
    if rank >= k:
        return None
    group = groups[k]
    mine = _data(case, rank)
    expected = mine.clone()
    dist.all_reduce(expected, group=group)
    if case["op"] == "avg":
        expected.div_(k)
    # A checked ring call runs twice: the repeat takes the fast path (data first, checked at the end).
    calls = ["", " (repeated)"] if case["algorithm"] == "ring" and case["check"] else [""]
    for call in calls:
        mine = _data(case, rank)
        address = mine.data_ptr()
        got = ALGORITHMS[case["algorithm"]](mine, op=case["op"], group=group, check=case["check"])
        if got is not mine or mine.data_ptr() != address or mine.shape != expected.shape:
            return f"not in place{call}: the result is not the same tensor, storage and shape"
        if case["values"] == "integers":
            close = torch.equal(mine, expected)
        else:
            tol = TOLERANCE[case["dtype"]]
            close = torch.allclose(mine.double(), expected.double(), rtol=tol, atol=tol * k)
        if not close:
            worst = (mine.double() - expected.double()).abs().max().item()
            return f"differs from dist.all_reduce by up to {worst:g}{call}"
    return None


def hypothesis_cases(max_examples: int) -> dict[str, Any]:
    """Rank 0 draws cases with hypothesis and broadcasts each one; every rank runs it.

    Returns (on rank 0): ``{"count": cases run, "covered": {(algorithm, k)}, "failures": [(case, {rank: why})]}``.
    """
    me = world.current()
    groups = _groups(me.world_size)
    if me.rank != 0:
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                return {}
            dist.gather_object(one_case(box[0], groups), None, dst=0)
    report: dict[str, Any] = {"count": 0, "covered": set(), "failures": []}

    @settings(max_examples=max_examples, database=None, deadline=None, derandomize=True,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(case=cases(me.world_size))
    @example(case={"algorithm": "ring", "k": 8, "shape": (0,), "dtype": "float32", "op": "avg", "values": "normal",
                   "check": True, "seed": 0})
    @example(case={"algorithm": "tree", "k": 7, "shape": (1,), "dtype": "bfloat16", "op": "sum",
                   "values": "integers", "check": False, "seed": 1})
    def drive(case: dict[str, Any]) -> None:
        dist.broadcast_object_list([case], src=0)
        problems: list[str | None] = [None] * me.world_size
        dist.gather_object(one_case(case, groups), problems, dst=0)
        report["count"] += 1
        report["covered"].add((case["algorithm"], case["k"]))
        found = {rank: why for rank, why in enumerate(problems) if why}
        if found:
            report["failures"].append((case, found))

    try:
        drive()
    finally:
        dist.broadcast_object_list([None], src=0)
    return report


def every_algorithm_and_size(numel: int = 1001) -> list[tuple[str, int, bool]]:
    """Each algorithm on each group size 1..world_size, sum of rank-valued tensors: (name, k, exact) per case."""
    me = world.current()
    groups = _groups(me.world_size)
    results = []
    for name, allreduce in sorted(ALGORITHMS.items()):
        for k, group in groups.items():
            if me.rank < k:
                tensor = torch.full((numel,), float(me.rank + 1))
                allreduce(tensor, group=group)
                results.append((name, k, bool(torch.all(tensor == k * (k + 1) / 2))))
    return results


def mismatches(bad_rank: int) -> dict[str, list[str]]:
    """Each algorithm with one rank disagreeing (numel, shape, dtype, op, or running the next algorithm);
    the error each rank raised."""
    me = world.current()
    shape, dtype, op = (6, 4), torch.float32, "sum"
    names = sorted(ALGORITHMS)
    errors: dict[str, list[str]] = {}
    for name in names:
        variants = {
            "numel": dict(shape=(6, 5)), "shape": dict(shape=(4, 6)), "dtype": dict(dtype=torch.float64),
            "op": dict(op="avg"), "algorithm": dict(name=names[(names.index(name) + 1) % len(names)]),
        }
        for what, change in variants.items():
            mine = {"shape": shape, "dtype": dtype, "op": op, "name": name}
            if me.rank == bad_rank:
                mine.update(change)
            try:
                ALGORITHMS[mine["name"]](torch.ones(mine["shape"], dtype=mine["dtype"]), op=mine["op"])
                errors.setdefault(f"{name}/{what}", []).append("no error")
            except ValueError as error:
                errors.setdefault(f"{name}/{what}", []).append(str(error))
    return errors


def changed_calls(bad_rank: int) -> dict[str, tuple[str, bool, bool]]:
    """A ring call every rank repeats (so it runs on the fast path: data first, shapes read at the end),
    then some ranks change theirs: the error every rank raised, and whether the next agreed call is right."""
    me = world.current()
    ring = ALGORITHMS["ring"]
    changes = {
        "numel": dict(shape=(6, 5)), "shape": dict(shape=(4, 6)), "dtype": dict(dtype=torch.float64),
        "op": dict(op="avg"), "algorithm": dict(name="tree"), "empty": dict(shape=(0,)),
    }
    everyone_else = set(range(me.world_size)) - {bad_rank}
    who = {"one": {bad_rank}, "neighbours": {bad_rank, bad_rank + 1}, "all but one": everyone_else}
    outcome: dict[str, tuple[str, bool, bool]] = {}
    for label, changed in who.items():
        for what, change in changes.items():
            for _ in range(2):  # the second is the verified call repeated
                ring(torch.ones(6, 4))
            fast = course.collectives.protocol.verified.get(dist.group.WORLD) is not None  # the unchanged ranks' path
            mine = {"shape": (6, 4), "dtype": torch.float32, "op": "sum", "name": "ring"}
            if me.rank in changed:
                mine.update(change)
            tensor = torch.ones(mine["shape"], dtype=mine["dtype"])
            try:
                ALGORITHMS[mine["name"]](tensor, op=mine["op"])
                message = "no error"
            except ValueError as error:
                message = str(error)
            left_as_documented = bool(tensor.isnan().all() if me.rank not in changed else (tensor == 1).all())
            after = ring(torch.full((6, 4), float(me.rank + 1)))
            expected = me.world_size * (me.world_size + 1) / 2
            outcome[f"{label}/{what}"] = (message, bool((after == expected).all()), fast, left_as_documented)
    return outcome


def small_rings(bad_rank: int = 1) -> dict[str, tuple[str, bool]]:
    """Repeated ring calls on groups of 2 and 3 (in a ring of 2 both neighbours are one rank), then rank
    ``bad_rank`` changes its numel: the error each rank of the group raised, and whether its next call is right."""
    me = world.current()
    groups = _groups(me.world_size)
    outcome: dict[str, tuple[str, bool]] = {}
    for k in (2, 3):
        if me.rank >= k:
            continue
        ring = partial(ALGORITHMS["ring"], group=groups[k])
        repeated = [ring(torch.full((7,), float(me.rank + 1))) for _ in range(3)]
        right = all(bool((result == k * (k + 1) / 2).all()) for result in repeated)
        try:
            ring(torch.ones(8 if me.rank == bad_rank else 7))
            message = "no error"
        except ValueError as error:
            message = str(error)
        after = ring(torch.full((7,), float(me.rank + 1)))
        outcome[str(k)] = (message, right and bool((after == k * (k + 1) / 2).all()))
    return outcome


def nan_in_the_data() -> list[bool]:
    """A repeated ring call whose data holds NaN (first element, then another): no error, NaN where gloo puts
    it, and the next call right."""
    me = world.current()
    ring = ALGORITHMS["ring"]
    outcome = []
    for where in (0, 5, None):
        mine = torch.full((9,), float(me.rank + 1))
        if where is not None and me.rank == 1:
            mine[where] = math.nan
        expected = mine.clone()
        dist.all_reduce(expected)
        ring(torch.ones(9))  # so the call below repeats it
        got = ring(mine)
        same_nan = torch.equal(got.isnan(), expected.isnan())
        outcome.append(same_nan and torch.equal(got.nan_to_num(), expected.nan_to_num()))
    return outcome


def who_a_repeated_ring_call_tells() -> dict[str, list[int]]:
    """The peers a ring call's check messages go to (anything not on the data's tag 0): for a new call, then for
    the same call repeated."""
    Comm = course.collectives.protocol.Comm
    told: list[int] = []
    saved = Comm.isend

    def recording(comm, tensor, peer, tag=0):
        if tag != 0:
            told.append(peer)
        return saved(comm, tensor, peer, tag)

    Comm.isend = recording
    try:
        found = {}
        for label, numel in (("new", 13), ("repeated", 13)):
            told.clear()
            ALGORITHMS["ring"](torch.ones(numel))
            found[label] = sorted(told)
        return found
    finally:
        Comm.isend = saved


def from_a_thread(numel: int = 4099) -> list[bool]:
    """Each algorithm called from a dedicated communication thread, as a distributed optimizer would."""
    me = world.current()
    outcome: list[bool] = []

    def communicate() -> None:
        for name in sorted(ALGORITHMS):
            tensor = torch.full((numel,), float(me.rank))
            ALGORITHMS[name](tensor, op="avg")
            outcome.append(bool(torch.allclose(tensor, torch.full_like(tensor, (me.world_size - 1) / 2))))

    thread = threading.Thread(target=communicate)
    thread.start()
    thread.join()
    return outcome


def ring_in_pieces(piece_bytes: int = 64) -> list[bool]:
    """The ring with tiny pieces (many per chunk, pipelined), on sizes around chunk and piece edges."""
    saved, course.collectives.allreduce.RING_PIECE_BYTES = course.collectives.allreduce.RING_PIECE_BYTES, piece_bytes
    try:
        outcome = []
        for numel in (1, 7, 63, 64 * world.current().world_size + 3, 10_007):
            generator = torch.Generator().manual_seed(numel * 64 + world.current().rank)
            mine = torch.randint(-8, 9, (numel,), generator=generator).float()
            expected = mine.clone()
            dist.all_reduce(expected)
            outcome.append(torch.equal(course.collectives.allreduce.ring_allreduce(mine), expected))
        return outcome
    finally:
        course.collectives.allreduce.RING_PIECE_BYTES = saved


def with_reduce_ops() -> list[bool]:
    """Each algorithm with torch's op constants, dist.ReduceOp.SUM and dist.ReduceOp.AVG, as dist.all_reduce takes."""
    me = world.current()
    n = me.world_size
    outcome = []
    for name in sorted(ALGORITHMS):
        for op, expected in ((dist.ReduceOp.SUM, n * (n + 1) / 2), (dist.ReduceOp.AVG, (n + 1) / 2)):
            tensor = ALGORITHMS[name](torch.full((11,), float(me.rank + 1)), op=op)
            outcome.append(bool(torch.all(tensor == expected)))
    return outcome


def sends(numel_per_rank: int = 10) -> dict[str, list[tuple[int, int]]]:
    """Every point-to-point send each algorithm makes on each group size, in order, as (dest, chunk) with
    group ranks and ``allreduce_sim``'s chunk numbering (``WHOLE`` for the whole tensor): ``"name/k"`` keys."""
    from course.collectives.schedules import WHOLE

    me = world.current()
    groups = _groups(me.world_size)
    Comm = course.collectives.protocol.Comm
    recorded: list[tuple[int, int]] = []
    flat = torch.empty(0)

    def chunk_of(tensor: torch.Tensor) -> int:
        if tensor.numel() == flat.numel():
            return WHOLE
        offset = (tensor.data_ptr() - flat.data_ptr()) // tensor.element_size()
        bounds = course.collectives.allreduce.chunk_bounds(flat.numel(), dist.get_world_size(group))
        return bounds.index((offset, offset + tensor.numel()))

    def recording(call):
        def record(comm, tensor, peer, *tag):
            recorded.append((peer, chunk_of(tensor), "isend"))
            return call(comm, tensor, peer, *tag)
        return record

    def recording_exchange(call):
        def record(comm, outgoing, incoming):
            recorded.extend((to, chunk_of(tensor), "exchange") for tensor, to in outgoing if tensor.numel())
            return call(comm, outgoing, incoming)
        return record

    saved = Comm.isend, Comm.exchange
    Comm.isend = recording(Comm.isend)  # Comm.send is isend(...).wait(): every message leaves through it,
    Comm.exchange = recording_exchange(Comm.exchange)  # or, batched, through exchange
    try:
        found = {}
        for name in sorted(ALGORITHMS):
            for k, group in groups.items():
                if me.rank < k:
                    flat = torch.ones(numel_per_rank * k + 3)  # one piece per ring chunk; chunks of unequal size
                    recorded.clear()
                    ALGORITHMS[name](flat, group=group, check=False)
                    found[f"{name}/{k}"] = list(recorded)
        return found
    finally:
        Comm.isend, Comm.exchange = saved


@contextlib.contextmanager
def batched_everywhere() -> Iterator[None]:
    """Run NCCL's code paths on gloo (no ``TAGGED_BACKENDS``): the ring in lock-step, the agreement in one batch."""
    saved, course.collectives.allreduce.TAGGED_BACKENDS = course.collectives.allreduce.TAGGED_BACKENDS, ()
    try:
        yield
    finally:
        course.collectives.allreduce.TAGGED_BACKENDS = saved


def batched(bad_rank: int) -> dict[str, Any]:
    """The ring in lock-step (as on NCCL) on every group size and around chunk edges, against dist.all_reduce;
    the sends it makes; and a rank that disagrees, named on every rank."""
    me = world.current()
    groups = _groups(me.world_size)
    with batched_everywhere():
        right = []
        for k, group in groups.items():
            for numel in (0, 1, k - 1, 10 * k + 3, 1001):
                for op, check in (("sum", True), ("avg", False)):
                    if me.rank >= k:
                        continue
                    generator = torch.Generator().manual_seed(numel * 64 + me.rank)
                    mine = torch.randint(-8, 9, (numel,), generator=generator).double()
                    expected = mine.clone()
                    dist.all_reduce(expected, group=group)
                    expected = expected / k if op == "avg" else expected
                    got = course.collectives.allreduce.ring_allreduce(mine, op, group, check=check)
                    right.append((k, numel, op, torch.equal(got, expected)))
        return {"right": right, "sends": sends(), "mismatches": mismatches(bad_rank)}


def everything(max_examples: int, bad_rank: int) -> dict[str, Any]:
    """All of the above in one launch."""
    return {
        "sizes": every_algorithm_and_size(),
        "mismatches": mismatches(bad_rank),
        "changed": changed_calls(bad_rank),
        "small_rings": small_rings(),
        "nan": nan_in_the_data(),
        "told": who_a_repeated_ring_call_tells(),
        "thread": from_a_thread(),
        "pieces": ring_in_pieces(),
        "reduce_ops": with_reduce_ops(),
        "sends": sends(),
        "batched": batched(bad_rank),
        "reference": compare_with_reference(1001),
        "hypothesis": hypothesis_cases(max_examples),
    }
