"""course.collectives.allreduce: naive, ring and tree against dist.all_reduce on world sizes 1-8, many sizes and dtypes.

Starting ranks is the slow part, so one 8-rank launch runs every multi-rank check (world sizes 1-7 are
sub-groups of it); the tests below read its report.
"""

import allreduce_ranks
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from course.collectives.allreduce import ALGORITHMS, chunk_bounds
from course.runtime.launch import launch

WORLD_SIZE = 8
BAD_RANK = 5
MAX_EXAMPLES = 80


@pytest.fixture(scope="module")
def report():
    return launch(allreduce_ranks.everything, WORLD_SIZE, MAX_EXAMPLES, BAD_RANK, timeout_s=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_algorithm_on_every_world_size_from_1_to_8(report):
    done = sorted((name, k) for rank in report for name, k, exact in rank["sizes"] if exact)
    expected = sorted((name, k) for name in ALGORITHMS for k in range(1, WORLD_SIZE + 1) for _ in range(k))
    assert done == expected


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hypothesis_cases_match_dist_all_reduce(report):
    cases = report[0]["hypothesis"]
    assert cases["failures"] == []
    assert cases["count"] >= MAX_EXAMPLES // 2
    assert {name for name, _ in cases["covered"]} == set(ALGORITHMS)
    assert {k for _, k in cases["covered"]} == set(range(1, WORLD_SIZE + 1))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("what", ["numel", "shape", "dtype", "op", "algorithm"])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_rank_that_disagrees_is_named_on_every_rank(report, name, what):
    for rank in report:
        (message,) = rank["mismatches"][f"{name}/{what}"][:1]
        assert f"rank {BAD_RANK} has" in message, message
        if what == "algorithm":  # the odd rank runs the next algorithm in ALGORITHMS
            assert f"{name} allreduce" in message and " allreduce while rank 0 has" in message
        assert "same tensor shape, dtype, op and algorithm on every rank" in message


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("who", ["one", "neighbours", "all but one"])
@pytest.mark.parametrize("what", ["numel", "shape", "dtype", "op", "algorithm", "empty"])
def test_a_rank_that_changes_a_verified_ring_call_is_named_on_every_rank(report, who, what):
    """The repeated call moves data before reading shapes: the changed ranks stand in for the ring, so every
    rank still finishes, raises, and leaves the group clean for the next call."""
    for rank in report:
        message, next_call_right, was_verified, left_as_documented = rank["changed"][f"{who}/{what}"]
        assert was_verified  # so the unchanged ranks took the fast path
        assert "same tensor shape, dtype, op and algorithm on every rank" in message, message
        assert f"rank {BAD_RANK} has" in message, message  # the first rank whose call differs from rank 0's
        assert next_call_right
        assert left_as_documented  # NaN on the fast ranks, untouched on the changed ones


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", ["2", "3"])
def test_rings_of_2_and_3_repeat_calls_and_name_a_rank_that_changes(report, k):
    for rank in report[:int(k)]:
        message, right = rank["small_rings"][k]
        assert "rank 1 has numel 8" in message and "rank 0 has numel 7" in message, message
        assert right


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_repeated_ring_call_with_nan_in_the_data_is_no_mismatch(report):
    """The fast path reads a NaN at the start of its result as a sign that some rank stood in: with NaN in the
    data it asks everyone, finds they all agree, and returns the result dist.all_reduce gives."""
    assert [rank["nan"] for rank in report] == [[True] * 3] * WORLD_SIZE


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_repeated_ring_call_tells_its_right_neighbour_only(report):
    """A new call tells its right neighbour, answers its left one (which is new too) and tells everyone; a
    repeated one sends a single check message, on the link its data takes anyway."""
    for rank, got in enumerate(report):
        left, right = (rank - 1) % WORLD_SIZE, (rank + 1) % WORLD_SIZE
        assert got["told"]["new"] == sorted([r for r in range(WORLD_SIZE) if r != rank] + [left, right])
        assert got["told"]["repeated"] == [right]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_safe_from_a_communication_thread(report):
    assert [rank["thread"] for rank in report] == [[True] * len(ALGORITHMS)] * WORLD_SIZE


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ring_pipelined_in_many_pieces_matches_dist_all_reduce(report):
    assert [rank["pieces"] for rank in report] == [[True] * 5] * WORLD_SIZE


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torch_reduce_op_constants_work_like_the_strings(report):
    assert [rank["reduce_ops"] for rank in report] == [[True] * 2 * len(ALGORITHMS)] * WORLD_SIZE


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("batched", [False, True], ids=["pipelined", "batched"])
def test_every_send_is_the_one_allreduce_sim_draws(report, batched):
    for name, schedule in ((name, row.schedule) for name, row in ALGORITHMS.items()):
        for k in range(1, WORLD_SIZE + 1):
            for rank in range(k):
                sent = (report[rank]["batched"] if batched else report[rank])["sends"][f"{name}/{k}"]
                drawn = [(m.dest, m.chunk) for step in schedule(k) for m in step.messages if m.source == rank]
                assert [(dest, chunk) for dest, chunk, _ in sent] == drawn, (name, k, rank)
                if name == "ring":  # batched: never a receive posted ahead of a send (a deadlock on NCCL)
                    assert {via for _, _, via in sent} <= {"exchange" if batched else "isend"}, (k, rank)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ring_in_lock_step_as_on_nccl_matches_dist_all_reduce(report):
    """On NCCL the ring runs lock-step, each step's send and receive in one batch: here that path runs on gloo
    (course.collectives.allreduce.TAGGED_BACKENDS emptied), on every group size, with unequal and empty chunks, one
    element."""
    for rank, got in enumerate(report):
        cases = got["batched"]["right"]
        assert len(cases) == 10 * sum(1 for k in range(rank + 1, WORLD_SIZE + 1)), rank
        assert [case for case in cases if not case[-1]] == []


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_rank_that_disagrees_is_named_on_every_rank_when_batched(report, name):
    for rank in report:
        for what in ("numel", "shape", "dtype", "op", "algorithm"):
            (message,) = rank["batched"]["mismatches"][f"{name}/{what}"][:1]
            assert f"rank {BAD_RANK} has" in message, (what, message)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compare_with_reference_reports_float64_rounding_only(report):
    for rank in report:
        assert set(rank["reference"]) == set(ALGORITHMS)
        assert all(0 <= difference < 1e-12 for difference in rank["reference"].values())


@given(numel=st.integers(0, 10_000), world_size=st.integers(1, 64))
def test_chunk_bounds_cover_the_tensor_in_near_equal_contiguous_chunks(numel, world_size):
    bounds = chunk_bounds(numel, world_size)
    assert len(bounds) == world_size
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(stop == start for (_, stop), (start, _) in zip(bounds, bounds[1:], strict=False))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("op", ["sum", "avg", dist.ReduceOp.SUM, dist.ReduceOp.AVG])
def test_without_a_process_group_it_is_a_world_of_one(name, op):
    tensor = torch.arange(5.0)
    assert ALGORITHMS[name](tensor, op=op) is tensor
    assert torch.equal(tensor, torch.arange(5.0))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_bad_arguments_are_refused_with_the_fix(name):
    allreduce = ALGORITHMS[name]
    allowed = r"op must be one of \('sum', 'avg'\) or dist.ReduceOp.SUM / dist.ReduceOp.AVG, got"
    for op in ("max", dist.ReduceOp.MAX, 0):  # 0 == dist.ReduceOp.SUM in torch, but it is no op
        with pytest.raises(ValueError, match=allowed):
            allreduce(torch.ones(3), op=op)
    with pytest.raises(ValueError, match="supports dtypes"):
        allreduce(torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"contiguous tensor.*x.contiguous\(\)"):
        allreduce(torch.ones(4, 4).t())
    with pytest.raises(TypeError, match="needs a torch.Tensor"):
        allreduce([1.0, 2.0])
