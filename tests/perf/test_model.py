"""The performance model: closed forms, published model sizes, and properties that must hold for any input."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.collectives import cost_model
from course.monitor import summary as utilization_summary
from course.perf import catalog as hardware
from course.perf import model as pm
from course.perf import workloads

A = pm.Assumptions()
PCIE3 = hardware.link("PCIe 3.0 x16")
ONE_NODE = pm.Cluster(hardware.gpu("V100 SXM2"), hardware.link("NVLink 2 (V100, 6 links)"), 8)
TWO_LEVEL = pm.Cluster(hardware.gpu("A100 SXM4"), hardware.link("NVSwitch (A100, NVLink 3)"), 8,
                       hardware.link("InfiniBand HDR"))
R50 = workloads.resnet()


def test_layer_seconds_is_a_roofline_plus_launches():
    gpu = hardware.gpu("V100 SXM2")
    a = replace(A, compute_efficiency=0.5, memory_efficiency=1.0, launch_s=1e-6)
    heavy = workloads.Layer("matmul", flops=1e9, params=0, activations=0, kernels=2)
    assert pm.layer_seconds(heavy, 10, gpu, a) == pytest.approx(1e10 / (15.7e12 * 0.5) + 2e-6)
    light = workloads.Layer("relu", flops=0, params=0, activations=1e6, kernels=1)
    assert pm.layer_seconds(light, 10, gpu, a) == pytest.approx(4e7 / 900e9 + 1e-6)
    assert pm.layer_seconds(light, 10, gpu, a, 2.0) == pytest.approx(2 * (4e7 / 900e9 + 1e-6))


def test_allreduce_uses_the_course_cost_model():
    link = pm.alpha_beta(ONE_NODE.intra, A)
    for scheme in ("ring", "tree"):
        assert pm.allreduce_seconds(1e8, 8, ONE_NODE, scheme, A) == pytest.approx(
            cost_model.predict(scheme, 1e8, 8, link))
    inside = cost_model.predict("ring", 1e8, 8, pm.alpha_beta(TWO_LEVEL.intra, A))
    between = cost_model.predict("ring", 1e8, 4, pm.alpha_beta(TWO_LEVEL.inter, A))
    assert pm.allreduce_seconds(1e8, 32, TWO_LEVEL, "hierarchical", A) == pytest.approx(inside + between)
    flat = cost_model.predict("ring", 1e8, 32, pm.alpha_beta(TWO_LEVEL.inter, A))
    assert pm.allreduce_seconds(1e8, 32, TWO_LEVEL, "ring", A) == pytest.approx(flat)


def test_server_exchange_closed_form():
    link = cost_model.AlphaBeta(0.0, 1 / 16e9)
    assert pm.server_seconds(160e6, 3, link) == pytest.approx(0.060)  # d2l: 30 ms in, 30 ms out


def test_one_gpu_has_no_communication():
    step = pm.step_time(R50, 32, 1, ONE_NODE)
    assert step.comm_s == 0 and step.step_s == pytest.approx(step.compute_s)
    assert step.backward_s == pytest.approx(2 * step.forward_s, rel=1e-9)


def test_without_overlap_all_communication_is_exposed():
    step = pm.step_time(R50, 32, 8, ONE_NODE, a=replace(A, overlap=False))
    assert step.exposed_comm_s == pytest.approx(step.comm_s)
    assert step.step_s == pytest.approx(step.compute_s + step.comm_s)


def test_input_pipeline_bounds_the_step():
    slow = replace(A, samples_per_s=10.0)
    step = pm.step_time(R50, 32, 8, ONE_NODE, a=slow)
    assert step.step_s == pytest.approx(3.2)
    assert step.data_wait_s == pytest.approx(3.2 - step.compute_s - step.exposed_comm_s)
    naive = pm.step_time(R50, 32, 4, ONE_NODE, "naive", slow)
    link = pm.alpha_beta(ONE_NODE.intra, A)
    gather = 3 * (link.alpha_s + R50.gradient_bytes * link.beta_s_per_byte)  # after compute: the gradients
    assert naive.step_s == pytest.approx(3.2 + naive.compute_s + gather)
    assert step.timeline[0][0].kind == "data wait"


def test_naive_sends_everything_through_device_zero():
    step = pm.step_time(R50, 32, 4, ONE_NODE, "naive", A)
    link = pm.alpha_beta(ONE_NODE.intra, A)
    expected = 3 * (2 * link.alpha_s + (2 * R50.gradient_bytes + 32 * R50.sample_bytes) * link.beta_s_per_byte)
    assert step.comm_s == pytest.approx(expected)
    busy = {rank: sum(s.end_s - s.start_s for s in segments if s.kind == "communication")
            for rank, segments in step.timeline.items()}
    assert busy[0] == pytest.approx(step.comm_s) and busy[1] == pytest.approx(step.comm_s / 3)
    assert any(s.kind == "idle" for s in step.timeline[1])


def test_errors_name_what_to_fix():
    with pytest.raises(ValueError, match="scheme"):
        pm.step_time(R50, 32, 2, ONE_NODE, "butterfly")
    with pytest.raises(ValueError, match="inter-node link"):
        pm.step_time(R50, 32, 16, ONE_NODE)
    with pytest.raises(ValueError, match="precision"):
        pm.step_time(R50, 32, 1, ONE_NODE, a=replace(A, precision="fp8"))


def test_strong_scaling_splits_one_global_batch_over_the_ranks():
    strong = pm.scaling_curve(R50, None, (1, 4), TWO_LEVEL, global_batch_size=128)
    assert strong[4]["step"].step_s == pytest.approx(pm.step_time(R50, 32, 4, TWO_LEVEL).step_s)
    assert strong[4]["speedup"] == pytest.approx(pm.step_time(R50, 128, 1, TWO_LEVEL).step_s / strong[4]["step"].step_s)
    for batch_size, global_batch_size in ((32, 128), (None, None)):
        with pytest.raises(ValueError, match="give either batch_size"):
            pm.scaling_curve(R50, batch_size, (1, 4), TWO_LEVEL, global_batch_size=global_batch_size)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 256), n=st.integers(2, 64), scheme=st.sampled_from(pm.SCHEMES))
def test_scaling_never_beats_ideal_and_overlap_never_hurts(batch, n, scheme):
    curve = pm.scaling_curve(R50, batch, (1, n), TWO_LEVEL, scheme)
    assert curve[1]["speedup"] == pytest.approx(1.0)
    assert 0 < curve[n]["efficiency"] <= 1 + 1e-9
    serial = pm.step_time(R50, batch, n, TWO_LEVEL, scheme, replace(A, overlap=False))
    assert curve[n]["step"].step_s <= serial.step_s + 1e-12


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 256), n=st.integers(1, 63))
def test_more_gpus_or_slower_links_never_speed_up_a_step(batch, n):
    step = pm.step_time(R50, batch, n, TWO_LEVEL, "hierarchical")
    assert pm.step_time(R50, batch, n + 1, TWO_LEVEL, "hierarchical").step_s >= step.step_s - 1e-12
    slower = replace(TWO_LEVEL, inter=hardware.link("10GbE"))
    assert pm.step_time(R50, batch, n, slower, "hierarchical").step_s >= step.step_s - 1e-12


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 128), n=st.integers(1, 16), scheme=st.sampled_from(pm.SCHEMES))
def test_every_device_timeline_covers_the_step(batch, n, scheme):
    step = pm.step_time(R50, batch, n, TWO_LEVEL, scheme)
    assert sorted(step.timeline) == list(range(n))
    for segments in step.timeline.values():
        assert {s.kind for s in segments} <= set(pm.KINDS)
        assert min(s.start_s for s in segments) == pytest.approx(0.0, abs=1e-12)
        assert max(s.end_s for s in segments) == pytest.approx(step.step_s)


def test_history_replays_the_compute_fraction():
    step = pm.step_time(R50, 32, 4, ONE_NODE, "naive", A)
    history = pm.to_history(step, steps=2, samples_per_step=200)
    assert history.kind == "modelled" and "modelled" in history.labels[0]
    mean = {s.device: s.mean_utilization for s in utilization_summary.summarize(history)}
    assert mean[0] == pytest.approx(100 * step.compute_s / step.step_s, rel=0.02)


def test_monitor_labels_a_modelled_history_as_modelled():
    from course.monitor import summary_plot

    history = pm.to_history(pm.step_time(R50, 32, 2, ONE_NODE), steps=1)
    text = summary_plot.format_summary(history)
    assert text.startswith("Modelled GPUs") and "Not a measurement" in text and "MiB" not in text
    assert utilization_summary.busy_threshold(history, cpu_count=1) == 50.0  # a modelled GPU can reach 100%


def test_the_assumptions_read_as_a_sentence_not_a_dataclass_repr():
    text = str(pm.Assumptions(precision="fp16", samples_per_s=1000))
    assert text.startswith("fp16 compute at 33% of peak") and "1,000 samples/s" in text and "Assumptions(" not in text
    assert str(pm.Assumptions()).endswith("25 MiB buckets overlapping backward; data never waits")
