"""course.ddp.scaling: the core-count verdict and the plots of measured and modelled scaling."""

import pytest

from course import timing
from course.collectives import cost_model
from course.ddp import calibration, scaling
from course.perf import catalog as hardware
from course.perf import model as perf_model
from course.perf import workloads


def test_speedup_above_the_cores_is_flagged_as_noise():
    one, four = timing.summarize([0.030] * 5), timing.summarize([0.036] * 5)
    value, text = scaling.speedup_verdict(one, four, 4, cores=2)
    assert value == pytest.approx(4 * 30 / 36) and "noise" in text and "above the 2x" in text
    value, text = scaling.speedup_verdict(one, four, 4, cores=4)
    assert "noise" not in text and "faster than the baseline in this run" in text


def test_speedup_against_limit_gives_no_verdict_near_1x_and_flags_only_noise():
    one, two = timing.summarize([0.030, 0.031, 0.029] * 3), timing.summarize([0.060, 0.059, 0.062] * 3)
    text = scaling.speedup_against_limit(one, two, 2, cores=2)
    assert text.startswith("speedup 1.0") and "of at most 2x" in text
    assert not any(word in text for word in ("faster", "slower", "noise"))  # near 1x: no verdict that could flip
    four = timing.summarize([0.036] * 5)
    assert "noise" in scaling.speedup_against_limit(timing.summarize([0.030] * 5), four, 4, cores=2)


def test_modelled_plots_draw_without_error():
    cluster = perf_model.Cluster(hardware.gpu("A100 SXM4"), hardware.link("PCIe 4.0 x16"), 8)
    curve = perf_model.scaling_curve(workloads.resnet(), 32, (1, 2, 4, 8), cluster)
    assert scaling.plot_modelled_scaling({"ResNet-50": curve}) is not None
    step = perf_model.step_time(workloads.resnet(), 32, 4, cluster, "naive")
    assert scaling.plot_modelled_timeline({"naive": step, "ring": curve[4]["step"]}) is not None


def test_measured_plot_draws_medians_intervals_and_calibration():
    timings = {(n, b): timing.summarize([0.001 * n * b, 0.0011 * n * b, 0.0012 * n * b]) for n in (1, 2, 4)
               for b in (16, 64)}
    model = calibration.Calibration(1e-3, 1e-4, cost_model.AlphaBeta(1e-4, 1e-9), 359_720, 2, {4: 4e-3},
                                    (16, 64))
    figure = scaling.plot_measured(timings, model)
    assert len(figure.axes[0].lines) >= 4  # a measured line and a calibration line per batch size


def test_a_modelled_step_is_described_term_by_term_and_the_overhead_named_when_it_dominates():
    from course.perf import catalog, workloads
    from course.perf import model as perf_model

    cluster = perf_model.Cluster(catalog.gpu("A100 SXM4"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                                 catalog.link("InfiniBand HDR"))
    mixed = perf_model.Assumptions(precision="amp")
    for workload, dominated in ((workloads.digits_cnn(), True), (workloads.resnet(), False)):
        curve = perf_model.scaling_curve(workload, 32, (1, 8), cluster, "hierarchical", mixed)
        step = curve[8]["step"]
        assert step.compute_s + step.exposed_comm_s + step.update_s == pytest.approx(step.step_s, rel=1e-6)
        text = scaling.describe_modelled_step("w", curve, 8)
        assert f"{step.update_s * 1e6:,.0f}" in text and f"{curve[8]['efficiency']:.0%}" in text
        assert ("fixed overhead" in text) is dominated
