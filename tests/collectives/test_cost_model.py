"""course.collectives.cost_model: the alpha-beta formulas, the fit, bus bandwidth and the crossover, against closed
forms."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.collectives import cost_model as cm
from course.collectives.timing_ranks import REFERENCE

links = st.builds(cm.AlphaBeta, alpha_s=st.floats(1e-7, 1e-2), beta_s_per_byte=st.floats(1e-12, 1e-7))


def test_coefficients_match_the_table():
    assert cm.coefficients("ring", 4) == (6.0, 1.5)
    assert cm.coefficients("naive", 4) == (6.0, 6.0)
    assert cm.coefficients("tree", 5) == (6.0, 6.0)  # ceil(log2 5) = 3 rounds each way
    assert all(cm.coefficients(name, 1) == (0.0, 0.0) for name in ("naive", "ring", "tree"))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        cm.coefficients("butterfly", 4)
    with pytest.raises(ValueError, match="world_size must be a positive integer number of ranks, got 0"):
        cm.coefficients("ring", 0)


@given(link=links, world_size=st.integers(2, 64), nbytes=st.floats(1, 1e10))
def test_ring_never_costs_more_than_naive_and_its_bandwidth_term_is_the_lower_bound(link, world_size, nbytes):
    ring = cm.predict("ring", nbytes, world_size, link)
    assert ring <= cm.predict("naive", nbytes, world_size, link) * (1 + 1e-12)
    lower_bound = 2 * (world_size - 1) / world_size * nbytes * link.beta_s_per_byte
    assert ring == pytest.approx(2 * (world_size - 1) * link.alpha_s + lower_bound)


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert cm.algbw(1e9, 2.0) == 5e8
    assert cm.busbw(1e9, 2.0, 4) == pytest.approx(5e8 * 1.5)
    assert cm.busbw(1e9, 2.0, 1) == 0.0
    # the ring at its own model with alpha = 0 sustains exactly the link bandwidth as busbw
    link = cm.AlphaBeta(0.0, 1 / 10e9)
    assert cm.busbw(1e8, cm.predict("ring", 1e8, 8, link), 8) == pytest.approx(10e9)


@given(link=links, algorithm=st.sampled_from(["naive", "ring", "tree"]), world_size=st.integers(2, 16),
       noise_seed=st.integers(0, 1000))
def test_fit_recovers_alpha_and_beta_from_the_model_s_own_times(link, algorithm, world_size, noise_seed):
    sizes = np.logspace(2, 8, 12)
    times = cm.predict(algorithm, sizes, world_size, link)
    times = times * np.random.default_rng(noise_seed).uniform(0.999, 1.001, size=times.shape)
    fitted = cm.fit_allreduce(algorithm, world_size, sizes, times)
    assert np.allclose(cm.predict(algorithm, sizes, world_size, fitted), times, rtol=0.01)


def test_fit_on_exact_data_is_exact_and_never_negative():
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    fitted = cm.fit(sizes, 20e-6 + sizes / 1e9)
    assert fitted.alpha_s == pytest.approx(20e-6) and fitted.bandwidth == pytest.approx(1e9)
    # times that fall with size would need a negative beta: it is clamped to 0 and alpha refit
    clamped = cm.fit([1e3, 1e6], [2e-3, 1e-3])
    assert clamped.beta_s_per_byte == 0.0 and clamped.alpha_s > 0
    with pytest.raises(ValueError, match="at least two distinct sizes"):
        cm.fit([1e3, 1e3], [1.0, 1.0])
    with pytest.raises(ValueError, match="nothing to fit"):
        cm.fit_allreduce("ring", 1, sizes, sizes)


@given(link=links, world_size=st.integers(3, 64))
def test_crossover_is_where_tree_and_ring_cost_the_same(link, world_size):
    size = cm.crossover("tree", "ring", world_size, link)
    tree_steps = 2 * math.ceil(math.log2(world_size))
    if tree_steps >= 2 * (world_size - 1):  # n = 3: as many steps as the ring, so the ring always wins
        assert size is None
        return
    assert size > 0
    tree, ring = (cm.predict(name, size, world_size, link) for name in ("tree", "ring"))
    assert tree == pytest.approx(ring, rel=1e-9)
    assert cm.predict("tree", size / 2, world_size, link) < cm.predict("ring", size / 2, world_size, link)
    assert cm.predict("tree", size * 2, world_size, link) > cm.predict("ring", size * 2, world_size, link)
    # and a numerical root finder agrees with the closed form
    lo, hi = 1e-3, 1e15
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        tree_faster = cm.predict("tree", mid, world_size, link) < cm.predict("ring", mid, world_size, link)
        lo, hi = (mid, hi) if tree_faster else (lo, mid)
    assert lo == pytest.approx(size, rel=1e-6)


def test_no_crossover_when_one_algorithm_is_faster_everywhere():
    link = cm.AlphaBeta(1e-5, 1e-9)
    assert cm.crossover("naive", "ring", 8, link) is None  # same steps, more bytes: ring always wins
    assert cm.crossover("ring", "naive", 8, link) is None


@given(link=links, world_size=st.integers(2, 16), scale=st.floats(0.1, 10))
def test_model_error_is_measured_over_modelled_and_describe_fit_follows_it(link, world_size, scale):
    sizes = [1 << 10, 1 << 20]
    measured = {name: {n: scale * float(cm.predict(name, n, world_size, link)) for n in sizes}
                for name in ("ring", "tree")}
    measured[REFERENCE] = {n: 1.0 for n in sizes}  # not in the model: skipped
    ratios = cm.model_error(link, world_size, measured)
    assert set(ratios) == {"ring", "tree"}
    assert all(r == pytest.approx(scale) for by_size in ratios.values() for r in by_size.values())
    text = cm.describe_fit(ratios)
    if 0.8 <= scale <= 1.2:
        assert text.startswith("the model is within 20%")
    else:
        assert "does NOT fit" in text and ("underpredicts" in text) == (scale > 1)


def test_describe_fit_says_when_errors_go_both_ways_and_refuses_nothing():
    assert "ranges from 0.50 to 3.00" in cm.describe_fit({"ring": {1: 0.5, 2: 3.0}})
    with pytest.raises(ValueError, match="no measured/modelled ratios"):
        cm.describe_fit({})


def test_plot_draws_the_model_and_the_measurements():
    import matplotlib

    matplotlib.use("Agg")
    measured = {name: {1000: 1e-3, 10000: 2e-3} for name in ("naive", "ring", "tree", REFERENCE)}
    fig = cm.plot(4, cm.AlphaBeta(1e-4, 1e-9), measured)
    assert len(fig.axes[0].lines) == 7
    fig.canvas.draw()  # the legend sits beside the axes, so it hides no measured point (notebook 04)
    legend, axes = fig.axes[0].get_legend().get_window_extent(), fig.axes[0].get_window_extent()
    assert legend.x0 >= axes.x1


def test_shm_costs_two_barriers_and_three_copies():
    assert cm.coefficients("shm", 4) == (2.0, 3.0)
    assert cm.coefficients("shm", 1) == (0.0, 0.0)


def test_hierarchical_cost_matches_the_closed_form():
    inside, between = cm.AlphaBeta(2e-6, 1 / 5e9), cm.AlphaBeta(50e-6, 1 / 12.5e6)
    n_bytes = 4 << 20
    # 2 nodes x 2 ranks: 4 barriers + 5 copies inside, a ring of 2 leaders (2 steps of N/2) across
    expected = 4 * 2e-6 + 5 * n_bytes / 5e9 + 2 * 50e-6 + 1 * n_bytes / 12.5e6
    assert cm.predict_hierarchical(n_bytes, 2, 2, inside, between) == pytest.approx(expected)
    # the flat ring over 4 ranks: 6 steps of N/4, each waiting for the slow link
    assert cm.predict_flat(n_bytes, 2, 2, between) == pytest.approx(6 * 50e-6 + 1.5 * n_bytes / 12.5e6)
    # one rank per node: no intra-node term, just a ring over the nodes
    assert cm.predict_hierarchical(n_bytes, 1, 4, inside, between) == pytest.approx(cm.predict("ring", n_bytes, 4,
                                                                                                between))


@given(g=st.integers(1, 16), m=st.integers(1, 16))
def test_hierarchical_sends_fewer_bytes_and_steps_across_nodes_than_the_flat_ring(g, m):
    (_, _), (a_x, b_x) = cm.hierarchical_coefficients(g, m)
    a_flat, b_flat = cm.coefficients("ring", g * m)
    assert a_x <= a_flat and b_x <= b_flat + 1e-12
    assert (a_x < a_flat) == (g > 1)


def test_hierarchical_needs_ranks_and_nodes():
    with pytest.raises(ValueError, match="ranks_per_node must be a positive integer number of ranks, got 0"):
        cm.hierarchical_coefficients(0, 2)


def test_a_fit_without_latency_or_per_byte_cost_says_too_small_to_measure():
    assert str(cm.AlphaBeta(2e-6, 1e-9)) == "α = 2.0 µs, 1/β = 1.00 GB/s"
    assert str(cm.AlphaBeta(0.0, 0.0)) == "α too small to measure here, β too small to measure here"
    assert "inf" not in str(cm.AlphaBeta(1e-9, 1e-18)) and "0.0 µs" not in str(cm.AlphaBeta(1e-9, 1e-9))
