"""course.long_context.balance: the zigzag covers every position once and gives every rank the same causal work;
the contiguous layout leaves the last rank with about 2 - 1/n times the mean."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from course.long_context import balance


@given(st.integers(1, 8), st.integers(1, 6))
def test_each_layout_covers_every_position_once(world_size, chunk):
    seq_len = 2 * world_size * chunk
    for name in balance.LAYOUTS:
        held = torch.cat(balance.layout(name, world_size, seq_len))
        assert sorted(held.tolist()) == list(range(seq_len))


@given(st.integers(1, 8), st.integers(1, 6))
def test_the_zigzag_balances_causal_work_exactly(world_size, chunk):
    ranks = balance.layout("zigzag", world_size, 2 * world_size * chunk)
    assert len({balance.causal_work(p) for p in ranks}) == 1
    assert balance.imbalance(ranks) == 1.0


@pytest.mark.parametrize("world_size", [2, 4, 8, 16])
def test_the_contiguous_layout_overloads_the_last_rank(world_size):
    ranks = balance.layout("contiguous", world_size, 1024 * world_size)
    assert balance.imbalance(ranks) == pytest.approx(2 - 1 / world_size, rel=1e-3)


def test_work_per_step_adds_up_to_the_causal_work():
    ranks = balance.layout("contiguous", 4, 16)
    steps = balance.work_per_step(ranks)
    assert [sum(row) for row in steps] == [balance.causal_work(p) for p in ranks]
    assert steps[0][1:] == [0, 0, 0]  # rank 0 skips every block from the future


def test_a_sequence_that_does_not_cut_evenly_is_refused():
    with pytest.raises(ValueError, match="use a seq_len that 8 divides"):
        balance.zigzag_positions(0, 4, 20)
    with pytest.raises(ValueError, match="layout must be one of"):
        balance.layout("striped", 2, 8)
