"""course.scaling: medians with intervals, the core-count verdict, the calibration fit, and the measurement."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course import hardware, perf_model, scaling, timing, workloads
from course.runtime.launch import launch

pytestmark = pytest.mark.unit5


def test_speedup_above_the_cores_is_flagged_as_noise():
    one, four = timing.summarize([0.030] * 5), timing.summarize([0.036] * 5)
    value, text = scaling.speedup_verdict(one, four, 4, cores=2)
    assert value == pytest.approx(4 * 30 / 36) and "noise" in text and "above the 2x" in text
    value, text = scaling.speedup_verdict(one, four, 4, cores=4)
    assert "noise" not in text and text.endswith("faster than the baseline")


@given(fixed=st.floats(1e-3, 1e-2), per_sample=st.floats(1e-5, 1e-3), per_peer=st.floats(0, 1e-2),
       cores=st.integers(1, 4))
def test_calibration_recovers_the_model_it_was_fitted_on(fixed, per_sample, per_peer, cores):
    truth = scaling.Calibration(fixed, per_sample, per_peer, cores)
    timings = {(n, b): timing.summarize([truth.predict(n, b)] * 3) for n in (1, 2) for b in (16, 64)}
    fitted = scaling.fit_calibration(timings, cores)
    assert fitted.predict(4, 32) == pytest.approx(truth.predict(4, 32), rel=1e-6)


def test_calibration_needs_two_batch_sizes_on_one_rank():
    with pytest.raises(ValueError, match="2 batch sizes"):
        scaling.fit_calibration({(1, 16): timing.summarize([1.0] * 3), (2, 16): timing.summarize([1.0] * 3)}, 2)


def test_modelled_plots_draw_without_error():
    cluster = perf_model.Cluster(hardware.gpu("A100 SXM4"), hardware.link("PCIe 4.0 x16"), 8)
    curve = perf_model.scaling_curve(workloads.resnet(), 32, (1, 2, 4, 8), cluster)
    assert scaling.plot_modelled_scaling({"ResNet-50": curve}) is not None
    step = perf_model.step_time(workloads.resnet(), 32, 4, cluster, "naive")
    assert scaling.plot_modelled_timeline({"naive": step, "ring": curve[4]["step"]}) is not None


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_measure_step_samples_on_subgroups():
    results = launch(scaling.measure_step_samples, 2, (1, 2), (4, 8), 3, 2, 1, timeout_s=180)
    assert set(results[0]) == {(1, 4), (1, 8), (2, 4), (2, 8)}
    assert all(len(times) == 6 and min(times) > 0 for times in results[0].values())
    assert results[1] == {}


def test_measured_plot_draws_medians_intervals_and_calibration():
    timings = {(n, b): timing.summarize([0.001 * n * b, 0.0011 * n * b, 0.0012 * n * b]) for n in (1, 2, 4)
               for b in (16, 64)}
    figure = scaling.plot_measured(timings, scaling.fit_calibration(timings, 2))
    assert len(figure.axes[0].lines) >= 4  # a measured line and a calibration line per batch size
