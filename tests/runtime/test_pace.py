"""course.runtime.pace: limits grow on a slower or busier machine, by the measured factor, within bounds, and say so."""

import pytest

from course.runtime import pace
from course.runtime.pace import Pace, pace_of


def test_the_factor_is_the_measured_time_over_the_reference_within_bounds():
    assert pace_of(0.28, reference_s=0.14).factor == pytest.approx(2.0)
    assert pace_of(0.05, reference_s=0.14).factor == 1.0  # a faster machine keeps the limits as set
    assert pace_of(10.0, reference_s=0.14).factor == pace.MAX_FACTOR


def test_a_limit_scales_and_says_why_in_plain_words():
    slow = Pace(2.0, 0.28)
    assert slow.limit(180) == 360
    assert slow.why(180) == ("The time limit was 360 s: the usual 180 s times 2.0, because this machine ran a fixed "
                             "test 2.0 times slower than usual (other programs were using its processors).")
    assert Pace(1.0).why(180) == "The time limit was 180 s."


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError, match="must be positive seconds"):
        pace_of(0.0)


def test_the_machine_is_measured_once_per_process():
    first = pace.machine_pace()
    assert pace.machine_pace() is first and 1.0 <= first.factor <= pace.MAX_FACTOR and first.measured_s > 0
