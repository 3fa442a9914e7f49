"""course.scaling: the alpha-beta ring model, the step prediction and the speedup arithmetic."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course import scaling
from course.launch import launch

pytestmark = pytest.mark.unit5


def test_step_communication_is_the_ring_allreduce_closed_form():
    gpu = scaling.GpuAssumptions(peak_flops=1e12, efficiency=0.5, link_bandwidth=1e9, latency_s=1e-5)
    assert scaling.predict_step(1, 10, 1e9, 1e9, gpu).comm_s == 0.0
    # 4 ranks: 6 messages of latency, each rank sends 2 * 3/4 of the data
    assert scaling.predict_step(4, 10, 1e9, 1e9, gpu).comm_s == pytest.approx(6e-5 + 1.5)


@given(n=st.integers(2, 1024))
def test_ring_bandwidth_term_stays_below_twice_the_data(n):
    gpu = scaling.GpuAssumptions(peak_flops=1e12, efficiency=0.5, link_bandwidth=1e6, latency_s=0.0)
    assert scaling.predict_step(n, 1, 1.0, 1e6, gpu).comm_s < 2.0


def test_predict_step_adds_or_overlaps():
    gpu = scaling.GpuAssumptions(peak_flops=1e12, efficiency=0.5, link_bandwidth=1e9, latency_s=0.0)
    serial = scaling.predict_step(2, 10, 1e9, 1e9, gpu)
    assert serial.compute_s == pytest.approx(3 * 1e9 * 10 / 0.5e12)
    assert serial.comm_s == pytest.approx(1.0)
    assert serial.step_s == pytest.approx(serial.compute_s + 1.0)
    assert scaling.predict_step(2, 10, 1e9, 1e9, gpu, overlap=True).step_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        scaling.predict_step(2, 0, 1e9, 1e9, gpu)


def test_speedup_is_relative_to_one_rank():
    assert scaling.speedup({1: 1.0, 2: 1.0, 4: 2.0}) == {1: 1.0, 2: 2.0, 4: 2.0}
    with pytest.raises(ValueError, match="1-rank time"):
        scaling.speedup({2: 1.0})


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_measure_step_times_on_subgroups():
    results = launch(scaling.measure_step_times, 2, (1, 2), 8, 3, 1, timeout_s=180)
    assert set(results[0]) == {1, 2} and all(t > 0 for t in results[0].values())
    assert results[1] == {}
