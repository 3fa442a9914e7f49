"""course.timing: medians and bootstrap intervals, checked against numpy and hand-made samples (never timed)."""

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from course import timing

pytestmark = pytest.mark.unit1

samples = st.lists(st.floats(1e-6, 1e3, allow_nan=False), min_size=1, max_size=30)


@given(samples)
def test_summarize_keeps_the_median_inside_an_interval_within_the_samples(values):
    estimate = timing.summarize(values)
    assert estimate.median == pytest.approx(float(np.median(values)))
    assert min(values) <= estimate.low <= estimate.median <= estimate.high <= max(values)
    assert estimate.repeats == len(values)


def test_summarize_is_reproducible_and_narrows_with_more_repeats():
    rng = np.random.default_rng(1)
    few, many = rng.normal(10, 1, 8), rng.normal(10, 1, 400)
    assert timing.summarize(few) == timing.summarize(few)
    narrow, wide = timing.summarize(many), timing.summarize(few)
    assert narrow.high - narrow.low < wide.high - wide.low
    assert 10 in narrow


def test_one_repeat_has_a_zero_width_interval():
    assert timing.summarize([0.25]) == timing.Estimate(0.25, 0.25, 0.25, 1)


def test_an_outlier_moves_the_median_less_than_the_mean():
    values = [1.0] * 9 + [100.0]
    assert timing.summarize(values).median == 1.0


def test_ratio_of_medians_and_its_interval():
    estimate = timing.ratio([4.0, 4.0, 4.0], [2.0, 2.0, 2.0])
    assert (estimate.median, estimate.low, estimate.high) == (2.0, 2.0, 2.0)
    spread = timing.ratio([3.0, 4.0, 5.0, 4.0], [1.0, 2.0, 2.0, 3.0])
    assert spread.median == pytest.approx(2.0) and spread.low < 2.0 < spread.high


def test_formats_name_the_median_interval_and_repeats():
    text = timing.Estimate(0.0123, 0.0118, 0.0139, 20).format_ms()
    assert text == "12.3 ms (95% interval 11.8-13.9 ms, 20 repeats)"
    assert timing.Estimate(1.5, 1.25, 1.75, 7).format_ratio() == "1.50x (95% interval 1.25-1.75x, 7 repeats)"
    assert timing.Estimate(0.33, 0.25, 0.61, 8).format_percent() == "33% (95% interval 25-61%, 8 repeats)"


def test_time_repeats_calls_warmup_then_repeats():
    calls = []
    seconds = timing.time_repeats(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(seconds) == 4 and all(s >= 0 for s in seconds)


def test_speedup_verdict_flags_more_than_the_cores_allow_as_noise():
    assert timing.max_speedup(4, cores=2) == 2 and timing.max_speedup(1, cores=2) == 1
    assert "noise" in timing.speedup_verdict(timing.Estimate(3.3, 3.0, 3.6, 5), workers=4, cores=2)
    assert "cannot tell" in timing.speedup_verdict(timing.Estimate(1.1, 0.9, 1.3, 5), workers=4, cores=2)
    assert "slower" in timing.speedup_verdict(timing.Estimate(0.6, 0.5, 0.7, 5), workers=4, cores=2)
    assert "faster" in timing.speedup_verdict(timing.Estimate(1.8, 1.6, 1.9, 5), workers=4, cores=2)


@given(st.floats(0.3, 1.9), st.floats(0.0, 0.6), st.floats(0.0, 0.6))
def test_speedup_verdict_calls_a_side_only_when_the_whole_interval_clears_the_band(median, below, above):
    estimate = timing.Estimate(median, max(median - below, 0.01), median + above, 5)
    text = timing.speedup_verdict(estimate, workers=4, cores=2)
    band = (1 / timing.SPEEDUP_MARGIN, timing.SPEEDUP_MARGIN)
    overlaps = estimate.low <= band[1] and estimate.high >= band[0]
    assert ("cannot tell the two apart" in text) == overlaps
    assert ("faster" in text) == (estimate.low > band[1]) and ("slower" in text) == (estimate.high < band[0])


@given(st.floats(0.85, 1.15), st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_speedup_verdict_never_gives_a_side_to_an_interval_holding_1x(median, below, above):
    text = timing.speedup_verdict(timing.Estimate(median, median - below, median + above, 5), workers=4, cores=2)
    assert "cannot tell the two apart" in text and "faster" not in text and "slower" not in text


def test_speedup_verdict_refuses_a_band_that_is_not_above_1x():
    with pytest.raises(ValueError, match="upper edge above 1"):
        timing.speedup_verdict(timing.Estimate(1.0, 0.9, 1.1, 5), workers=4, cores=2, margin=1.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [[1.0]]])
def test_bad_samples_say_what_was_expected(bad):
    with pytest.raises(ValueError, match="non-empty sequence of finite numbers"):
        timing.summarize(bad)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="confidence"):
        timing.summarize([1.0], confidence=95)
    with pytest.raises(ValueError, match="denominator"):
        timing.ratio([1.0], [0.0])
    with pytest.raises(ValueError, match="repeats"):
        timing.time_repeats(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="workers"):
        timing.max_speedup(0)


def test_phase_clock_adds_up_each_phase_per_step():
    clock = timing.PhaseClock()
    for _ in range(3):
        clock.new_step()
        for _ in range(2):
            with clock.phase("compute"):
                sum(range(1000))
        with clock.phase("communicate"):
            pass
    compute, communicate, total = clock.seconds("compute"), clock.seconds("communicate"), clock.seconds()
    assert len(compute) == len(total) == 3 and all(c > 0 for c in compute)
    assert total == pytest.approx([a + b for a, b in zip(compute, communicate, strict=True)])
    assert clock.seconds("never") == [0.0, 0.0, 0.0]
    assert len(clock.started) == 3 and clock.started == sorted(clock.started)  # each step's start, in order
    with pytest.raises(RuntimeError, match="new_step"):
        with timing.PhaseClock().phase("compute"):
            pass


def test_usable_cores_is_this_process_share_of_the_machine():
    assert 1 <= timing.usable_cores() <= (os.cpu_count() or 1)
    assert timing.max_speedup(8) == min(8, timing.usable_cores())
