"""course.monitor.summary: means, busy fractions and fair shares, by hand and against their definitions."""

from __future__ import annotations

import statistics

import pytest
from histories import history_of
from hypothesis import given
from hypothesis import strategies as st

from course.monitor import summary as utilization_summary

# ---- summaries ---------------------------------------------------------------------------------------------

def test_summary_by_hand():
    history = history_of({0: [100, 80, 20, 0], 1: [0, 0, 0, 10]})
    history.labels[3] = "device 3"  # seen, never read
    s0, s1, s3 = utilization_summary.summarize(history, threshold=50)
    assert (s0.mean_utilization, s0.busy_fraction, s0.peak_memory_bytes, s0.readings) == (50.0, 0.5, 1000, 4)
    assert (s1.mean_utilization, s1.busy_fraction, s1.peak_memory_bytes) == (2.5, 0.0, 100)
    assert (s3.device, s3.mean_utilization, s3.busy_fraction, s3.readings) == (3, 0.0, 0.0, 0)


def test_busy_means_half_of_what_a_device_can_get():
    four = history_of({d: [0.0] for d in range(4)})
    assert utilization_summary.busy_threshold(history_of({0: [0.0]}, kind="nvml")) == 50.0
    assert utilization_summary.busy_threshold(four, cpu_count=2) == 25.0  # 4 processes on 2 cores: 50% each at most
    assert utilization_summary.busy_threshold(four, cpu_count=8) == 50.0  # a core each, and to spare
    s0 = utilization_summary.summarize(history_of({0: [30.0, 20.0], 1: [0.0], 2: [0.0], 3: [0.0]}))[0]
    assert s0.busy_threshold == utilization_summary.busy_threshold(four) and s0.busy_fraction in (0.5, 1.0)


percent = st.floats(0, 400, allow_nan=False)


@given(st.dictionaries(st.integers(0, 7), st.lists(percent, min_size=1, max_size=30), min_size=1),
       st.floats(0, 400, allow_nan=False), st.floats(0, 400, allow_nan=False))
def test_summary_matches_the_definitions(values, threshold, higher):
    higher = max(threshold, higher)
    history = history_of(values)
    summaries = utilization_summary.summarize(history, threshold)
    assert [s.device for s in summaries] == sorted(values)
    for s, stricter in zip(summaries, utilization_summary.summarize(history, higher), strict=True):
        series = values[s.device]
        assert s.mean_utilization == pytest.approx(statistics.fmean(series))
        assert s.busy_fraction == sum(v >= threshold for v in series) / len(series)
        assert stricter.busy_fraction <= s.busy_fraction  # a higher bar is cleared less often
