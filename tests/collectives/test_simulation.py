"""course.collectives.simulation: the simulated algorithms end with the sum everywhere, in the steps theory says."""

import math

import matplotlib
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.collectives import cost_model
from course.collectives.allreduce import ALGORITHMS
from course.collectives.schedules import WHOLE
from course.collectives.simulation import draw, example_inputs, simulate

matplotlib.use("Agg")

SCHEDULES = {name: row.schedule for name, row in ALGORITHMS.items()}
algorithms = st.sampled_from(sorted(SCHEDULES))


@given(algorithm=algorithms, world_size=st.integers(1, 12), numel=st.integers(0, 50), seed=st.integers(0, 99))
def test_every_rank_ends_with_the_sum(algorithm, world_size, numel, seed):
    inputs = example_inputs(world_size, numel, seed)
    sim = simulate(algorithm, inputs)
    np.testing.assert_array_equal(sim.final, np.broadcast_to(np.sum(inputs, axis=0), (world_size, numel)))
    assert sim.snapshots[-1].holds.all(), "some chunk misses some rank's input"


@given(world_size=st.integers(1, 16))
def test_step_counts_match_theory(world_size):
    n = world_size
    assert simulate("ring", example_inputs(n, 3)).steps == 2 * (n - 1)
    assert simulate("naive", example_inputs(n, 3)).steps == 2 * (n - 1)
    assert simulate("tree", example_inputs(n, 3)).steps == 2 * math.ceil(math.log2(n))


@given(world_size=st.integers(2, 12), chunks_per_rank=st.integers(1, 5))
def test_ring_sends_2_n_minus_1_over_n_of_the_tensor_per_rank_and_naive_piles_it_on_rank_0(world_size,
                                                                                          chunks_per_rank):
    n, numel = world_size, world_size * chunks_per_rank
    ring = simulate("ring", example_inputs(n, numel)).elements_sent
    assert ring.tolist() == [2 * (n - 1) * numel // n] * n
    naive = simulate("naive", example_inputs(n, numel)).elements_sent
    assert naive.tolist() == [(n - 1) * numel] + [numel] * (n - 1)


@given(algorithm=algorithms, world_size=st.integers(1, 12))
def test_each_rank_sends_and_receives_at_most_one_message_per_step(algorithm, world_size):
    for step in SCHEDULES[algorithm](world_size):
        sources = [m.source for m in step.messages]
        dests = [m.dest for m in step.messages]
        assert len(set(sources)) == len(sources) and len(set(dests)) == len(dests)
        assert all(m.chunk == WHOLE or 0 <= m.chunk < world_size for m in step.messages)


def test_ring_reduce_scatter_leaves_rank_r_owning_chunk_r_plus_1():
    n = 5
    sim = simulate("ring", example_inputs(n, 10))
    after_reduce_scatter = sim.snapshots[n - 1].holds
    for r in range(n):
        assert after_reduce_scatter[r, (r + 1) % n].all()
        assert not after_reduce_scatter[r, r].all()


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        simulate("butterfly", example_inputs(2, 2))
    with pytest.raises(ValueError, match="same length; got lengths \\[2, 3\\]"):
        simulate("ring", [np.zeros(2), np.zeros(3)])


@settings(max_examples=5, deadline=None)
@given(algorithm=algorithms, world_size=st.integers(1, 6))
def test_draw_makes_one_panel_per_snapshot(algorithm, world_size):
    import matplotlib.pyplot as plt

    sim = simulate(algorithm, example_inputs(world_size, 7))
    fig = draw(sim)
    assert sum(ax.has_data() for ax in fig.axes) == len(sim.snapshots)
    plt.close(fig)


def test_the_exercise_checker_accepts_the_ring_and_explains_a_wrong_one(capsys):
    from course.collectives.simulation import check_ring_send_chunk

    assert check_ring_send_chunk(lambda rank, step, world_size: (rank - step) % world_size)
    assert "Correct" in capsys.readouterr().out
    assert not check_ring_send_chunk(lambda rank, step, world_size: rank)
    assert "Not yet: on 2 ranks" in capsys.readouterr().out


@given(world_size=st.integers(2, 12), chunks_per_rank=st.integers(1, 5))
def test_the_busiest_rank_sends_half_the_cost_tables_b_for_naive_and_tree_and_all_of_it_for_the_ring(
        world_size, chunks_per_rank):
    """Notebook 04's sentence under its simulation: naive and tree receive, then send (b counts both); the ring
    receives while it sends (b counts the sends)."""
    numel = world_size * chunks_per_rank
    for name, share in (("naive", 0.5), ("tree", 0.5), ("ring", 1.0)):
        busiest = simulate(name, example_inputs(world_size, numel)).elements_sent.max() / numel
        assert busiest == pytest.approx(share * cost_model.coefficients(name, world_size)[1])
