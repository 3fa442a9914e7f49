"""course.model_parallel.schedules: GPipe and 1F1B run every micro-batch once each way, hold m vs at most p
micro-batches, and have the bubble (p-1)/(m+p-1) on a counted timeline."""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.model_parallel import schedules
from course.model_parallel.schedules import Op

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

sizes = st.tuples(st.integers(1, 6), st.integers(1, 12))


@settings(max_examples=40, deadline=None)
@given(sizes)
def test_every_schedule_runs_each_micro_batch_forward_then_backward_once(size):
    p, m = size
    for schedule in (schedules.gpipe, schedules.one_f_one_b):
        for stage in range(p):
            schedules.check_ops(schedule(p, m, stage), m)


@settings(max_examples=40, deadline=None)
@given(sizes)
def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_p_minus_stage(size):
    p, m = size
    for stage in range(p):
        assert schedules.in_flight(schedules.gpipe(p, m, stage)) == m
        assert schedules.in_flight(schedules.one_f_one_b(p, m, stage)) == min(p - stage, m) <= p


@settings(max_examples=40, deadline=None)
@given(sizes)
def test_both_schedules_idle_p_minus_1_over_m_plus_p_minus_1(size):
    p, m = size
    for schedule in (schedules.gpipe, schedules.one_f_one_b):
        assert schedules.simulated_bubble(schedule, p, m) == pytest.approx((p - 1) / (m + p - 1), abs=1e-9)


def test_1f1b_alternates_after_warm_up():
    ops = " ".join(map(str, schedules.one_f_one_b(4, 6, 1)))
    assert ops == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"


def test_a_broken_schedule_is_named():
    with pytest.raises(ValueError, match="runs B1 before F1"):
        schedules.check_ops([Op("F", 0), Op("B", 1), Op("F", 1), Op("B", 0)], 2)
    with pytest.raises(ValueError, match="never runs B1"):
        schedules.check_ops([Op("F", 0), Op("F", 1), Op("B", 0)], 2)
    with pytest.raises(ValueError, match="a second time"):
        schedules.check_ops([Op("F", 0), Op("F", 0)], 1)


def test_a_schedule_that_waits_on_itself_deadlocks_in_the_simulation():
    def backwards_first(p, m, stage):  # the last stage waits for a backward that needs its own forward
        return [Op("B", 0), Op("F", 0)] if stage == p - 1 else schedules.gpipe(p, m, stage)

    with pytest.raises(ValueError, match="deadlocks"):
        schedules.simulate(backwards_first, 2, 1)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="stage must be an integer stage index from 0 to 3"):
        schedules.gpipe(4, 2, 4)
    with pytest.raises(ValueError, match="num_micro_batches"):
        schedules.one_f_one_b(4, 0, 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3))
def test_interleaving_v_chunks_shrinks_the_bubble_to_p_minus_1_over_v_m_plus_p_minus_1(p, groups, v):
    m = groups * p
    schedule = functools.partial(schedules.interleaved, chunks=v)
    for stage in range(p):
        schedules.check_ops(schedule(p, m, stage), m, chunks=v)
    assert schedules.simulated_bubble(schedule, p, m) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-9)


def test_interleaved_needs_whole_groups_of_p_micro_batches():
    with pytest.raises(ValueError, match="multiple of 4, not 6"):
        schedules.interleaved(4, 6, 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 5), st.integers(2, 3), st.integers(2, 4))  # m >= 2p: the warm-up is not cut short
def test_interleaving_makes_the_first_stage_hold_more_activations_than_1f1b(p, groups, v):
    """Issue 33, item 11: stage 0 holds p + (p-1)/v whole-stage micro-batches (Narayanan et al. 2021's
    p·(1 + (p-1)/(p·v))), more than 1F1B's p; the cost of the smaller bubble lands on the first stages."""
    m = groups * p
    chunks = schedules.in_flight(schedules.interleaved(p, m, 0, chunks=v))
    assert chunks / v == pytest.approx(p + (p - 1) / v)
    assert chunks / v > schedules.in_flight(schedules.one_f_one_b(p, m, 0)) == p
