"""course.perf.model: the step as a timeline, against closed forms and properties that hold for any input."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.collectives import cost_model
from course.monitor import summary as utilization_summary
from course.perf import catalog, microbench, workloads
from course.perf import model as pm

pytestmark = pytest.mark.unit5

A = pm.Assumptions()
ONE_NODE = pm.Cluster(catalog.gpu("V100 SXM2"), catalog.link("NVLink 2 (V100, 6 links)"), 8)
TWO_LEVEL = pm.Cluster(catalog.gpu("A100 SXM4"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                       catalog.link("InfiniBand HDR"), 8)
R50 = workloads.resnet()
MEMORY, LAUNCH = microbench.constant("memory"), microbench.constant("launch")


def test_layer_time_adds_math_memory_and_launches():
    gpu = catalog.gpu("V100 SXM2")
    gemm = workloads.Layer("matmul", flops=1e9, params=0, activations=0, kernels=2, kind="matmul")
    rate = 15.7e12 * microbench.matmul_efficiency("fp32", "Volta")
    assert pm.layer_seconds(gemm, 10, gpu, A) == pytest.approx(1e10 / rate + 2 * LAUNCH)
    relu = workloads.Layer("relu", flops=0, params=0, activations=1e6, kernels=1)
    assert pm.layer_seconds(relu, 10, gpu, A) == pytest.approx(4e7 / (900e9 * MEMORY) + LAUNCH)
    assert pm.layer_seconds(relu, 10, gpu, A, 2.0) == pytest.approx(2 * (4e7 / (900e9 * MEMORY) + LAUNCH))
    both = replace(gemm, activations=1e6, kernels=3)  # the GEMM and the element-wise kernels run one after another
    assert pm.layer_seconds(both, 10, gpu, A) == pytest.approx(1e10 / rate + 4e7 / (900e9 * MEMORY) + 3 * LAUNCH)


def test_winograd_counts_fewer_multiplications_in_fp32_only():
    gpu, conv = catalog.gpu("P100 SXM2"), workloads.Layer("c", 1e9, 0, 0, 0, winograd=True)
    plain = replace(conv, winograd=False)
    assert pm.layer_seconds(conv, 1, gpu, A) == pytest.approx(pm.layer_seconds(plain, 1, gpu, A) / 2.25)
    half = replace(A, precision="fp16")
    assert pm.layer_seconds(conv, 1, gpu, half) == pytest.approx(pm.layer_seconds(plain, 1, gpu, half))


def test_the_step_is_a_bucket_timeline():
    # two layers; the last layer's gradient (first in backward) fills bucket 1, the first layer's bucket 2
    layers = (workloads.Layer("first", 1e12, 10_000_000, 0, 0), workloads.Layer("last", 1e12, 10_000_000, 0, 0))
    net = workloads.Workload("two", layers, 0)
    a = replace(A, bucket_bytes=40e6)
    step = pm.step_time(net, 1, 8, ONE_NODE, "ring", a)
    layer = pm.layer_seconds(layers[0], 1, ONE_NODE.gpu, a)
    allreduce = pm.allreduce_seconds(40e6, 8, ONE_NODE, "ring")
    ready = [2 * layer + 2 * layer, 2 * layer + 4 * layer]  # forward, then each layer's backward
    assert step.backward_s == pytest.approx(4 * layer)
    first_end = ready[0] + allreduce
    second_end = max(first_end, ready[1]) + allreduce
    assert step.step_s == pytest.approx(second_end + pm.update_seconds(net.params, ONE_NODE.gpu, a))
    assert step.exposed_comm_s == pytest.approx(second_end - ready[1])
    comm = [s for s in step.timeline[0] if s.kind == "communication"]
    assert [c.start_s for c in comm] == pytest.approx([ready[0], max(first_end, ready[1])])


def test_gradients_weigh_their_precision():
    assert A.gradient_element_bytes == 4 and replace(A, precision="amp").gradient_element_bytes == 4
    for half in ("bf16", "fp16"):
        a = replace(A, precision=half)
        ready, _ = pm.bucket_ready_times(R50, 0.0, [0.0] * len(R50.layers), a)
        assert sum(nbytes for _, nbytes in ready) == pytest.approx(2 * R50.params)  # the old model: 4 bytes


def test_one_gpu_has_no_communication():
    step = pm.step_time(R50, 32, 1, ONE_NODE)
    assert step.comm_s == 0 and step.step_s == pytest.approx(step.compute_s + step.update_s)
    assert step.backward_s == pytest.approx(2 * step.forward_s, rel=1e-9)


def test_input_pipeline_bounds_the_step():
    slow = replace(A, samples_per_s=10.0)
    step = pm.step_time(R50, 32, 8, ONE_NODE, a=slow)
    assert step.step_s == pytest.approx(3.2)
    assert step.timeline[0][0].kind == "data wait"
    assert step.data_wait_s == pytest.approx(3.2 - step.compute_s - step.exposed_comm_s - step.update_s)


def test_naive_sends_everything_through_device_zero():
    step = pm.step_time(R50, 32, 4, ONE_NODE, "naive", A)
    link = pm.alpha_beta(ONE_NODE.intra)
    expected = 3 * (2 * link.alpha_s + (2 * R50.gradient_bytes() + 32 * R50.sample_bytes) * link.beta_s_per_byte)
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
    with pytest.raises(ValueError, match="server shards"):
        pm.step_time(R50, 32, 16, TWO_LEVEL, "parameter_server", replace(A, server_shards=3))


def test_strong_scaling_splits_one_global_batch_over_the_ranks():
    strong = pm.scaling_curve(R50, None, (1, 4), TWO_LEVEL, global_batch_size=128)
    assert strong[4]["step"].step_s == pytest.approx(pm.step_time(R50, 32, 4, TWO_LEVEL).step_s)
    for batch_size, global_batch_size in ((32, 128), (None, None)):
        with pytest.raises(ValueError, match="give either batch_size"):
            pm.scaling_curve(R50, batch_size, (1, 4), TWO_LEVEL, global_batch_size=global_batch_size)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 256), n=st.integers(2, 64), scheme=st.sampled_from(pm.SCHEMES))
def test_scaling_never_beats_ideal(batch, n, scheme):
    curve = pm.scaling_curve(R50, batch, (1, n), TWO_LEVEL, scheme)
    assert curve[1]["speedup"] == pytest.approx(1.0)
    assert 0 < curve[n]["efficiency"] <= 1 + 1e-9


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 256), n=st.integers(1, 63))
def test_more_gpus_or_slower_links_never_speed_up_a_step(batch, n):
    step = pm.step_time(R50, batch, n, TWO_LEVEL, "hierarchical")
    assert pm.step_time(R50, batch, n + 1, TWO_LEVEL, "hierarchical").step_s >= step.step_s - 1e-12
    slower = replace(TWO_LEVEL, inter=catalog.link("10GbE"), nics_per_node=1)
    assert pm.step_time(R50, batch, n, slower, "hierarchical").step_s >= step.step_s - 1e-12


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 128), n=st.integers(1, 16), scheme=st.sampled_from(pm.SCHEMES))
def test_every_device_timeline_covers_the_step(batch, n, scheme):
    step = pm.step_time(R50, batch, n, TWO_LEVEL, scheme, replace(A, server_shards=1))
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
    computing = sum(s.end_s - s.start_s for s in step.timeline[0] if s.kind == "compute")
    assert mean[0] == pytest.approx(100 * computing / step.step_s, rel=0.02)


def test_allreduce_uses_the_course_cost_model():
    link = pm.alpha_beta(ONE_NODE.intra)
    assert pm.allreduce_seconds(1e8, 8, ONE_NODE, "ring") == pytest.approx(cost_model.predict("ring", 1e8, 8, link))
    assert pm.allreduce_seconds(1e8, 8, ONE_NODE, "pipelined_tree") == pytest.approx(
        cost_model.predict("pipelined_tree", 1e8, 8, link))


def test_compute_efficiency_depends_on_kernel_kind_precision_and_generation():
    # old defect: one compute efficiency for FP32 convolutions and tensor-core matmuls alike
    a100, bf16 = catalog.gpu("A100 SXM4"), replace(A, precision="bf16")
    gemm = workloads.Layer("gemm", 1e12, 0, 0, 0, kind="matmul")
    conv = replace(gemm, kind="conv")
    ampere, hopper = microbench.constant("matmul.half.Ampere"), microbench.constant("matmul.half.Hopper")
    assert pm.layer_seconds(gemm, 1, a100, bf16) == pytest.approx(1e12 / (312e12 * ampere))
    assert pm.layer_seconds(conv, 1, a100, bf16) == pytest.approx(1e12 / (312e12 * microbench.CONV_EFFICIENCY))
    assert pm.layer_seconds(gemm, 1, catalog.gpu("H100 SXM5"), bf16) == pytest.approx(1e12 / (989e12 * hopper))
