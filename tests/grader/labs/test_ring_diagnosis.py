"""grader.labs.ring_diagnosis names the mistake behind a wrong ring result, read off the numbers alone."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grader.labs.ring import check as ring
from grader.labs.ring.diagnosis import allowed, expected, first_wrong

SHAPES = st.tuples(st.integers(2, 8), st.integers(1, 200), st.sampled_from(sorted(ring.DTYPES)), st.integers(0, 99))


def outputs(inputs, op, dtype):
    """What a right ring leaves on every rank."""
    return [expected(inputs, op).to(dtype) for _ in range(inputs.shape[0])]


@settings(max_examples=60, deadline=None)
@given(SHAPES, st.sampled_from(["sum", "avg"]))
def test_a_right_answer_has_nothing_wrong(shape, op):
    world_size, numel, name, seed = shape
    inputs = ring.inputs(seed, world_size, numel, name)
    assert first_wrong(outputs(inputs, op, ring.DTYPES[name]), inputs, op, ring.DTYPES[name]) is None


@settings(max_examples=60, deadline=None)
@given(SHAPES, st.sampled_from(["sum", "avg"]), st.data())
def test_one_rank_counted_twice_in_one_chunk_on_every_rank_is_named(shape, op, data):
    world_size, numel, name, seed = shape
    numel += 8 * world_size  # chunks of 8 or more: in one element, twice one input can equal another mistake
    dtype, inputs = ring.DTYPES[name], ring.inputs(seed, world_size, numel, name)
    twice = data.draw(st.integers(0, world_size - 1))
    chunk = data.draw(st.integers(0, world_size - 1))
    index = torch.tensor_split(torch.arange(numel), world_size)[chunk]
    wrong = expected(inputs, op).clone()
    wrong[index] += inputs[twice, index] / (world_size if op == "avg" else 1)
    message = first_wrong([wrong.to(dtype)] * world_size, inputs, op, dtype)
    assert f"rank 0's chunk {chunk} " in message and "after the reduce-scatter" in message
    assert f"off by exactly rank {twice}'s input" in message


def test_a_missing_rank_the_forgotten_average_and_an_all_gather_slip_are_named():
    inputs = ring.inputs(3, 4, 10, "float64")
    total = inputs.sum(dim=0)
    missing = total - inputs[2]
    assert "rank 2's input is missing" in first_wrong([missing] * 4, inputs, "sum", torch.float64)
    assert "holds the sum, not the average" in first_wrong([total] * 4, inputs, "avg", torch.float64)
    slipped = [total.clone() for _ in range(4)]
    slipped[3][:3] = 0  # chunk 0 of rank 3 never arrived
    message = first_wrong(slipped, inputs, "sum", torch.float64)
    assert message.startswith("rank 3's chunk 0 (elements 0-2) is off by ")
    assert "in the all-gather: rank(s) 0, 1, 2 have it right" in message and "all zeros" in message


@settings(max_examples=30, deadline=None)
@given(SHAPES, st.sampled_from(["sum", "avg"]))
def test_the_derived_tolerance_holds_a_ring_in_any_order_and_hides_no_missing_input(shape, op):
    world_size, numel, name, seed = shape
    dtype, inputs = ring.DTYPES[name], ring.inputs(seed, world_size, numel, name)
    limit = allowed(inputs, op, dtype)
    # a ring adds the ranks' chunks starting anywhere: every rotation of the order, in the run's dtype
    for start in range(world_size):
        total = inputs[start].to(dtype)
        for k in range(1, world_size):
            total = total + inputs[(start + k) % world_size].to(dtype)
        result = total / world_size if op == "avg" else total
        assert bool(((result.double() - expected(inputs, op)).abs() <= limit).all())
    # the smallest mistake the lab plants (one input of size 1 too many or too few) lies beyond it: in every sum
    # (exact), and in an average but for bfloat16's (8 bits cannot tell 1/world_size from a ring dividing first)
    if op == "sum" or dtype != torch.bfloat16:
        assert float(limit.max()) < 1 / world_size / (2 if op == "avg" else 1)
