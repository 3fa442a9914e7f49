"""course.practice.profiling: the timeline read back from each rank's trace file agrees with DDP and the model."""

import json

import pytest
import torch

from course.perf import catalog
from course.perf.model import Segment, StepTime
from course.practice import profiling
from course.runtime.launch import launch


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    return launch(profiling.profile_ddp_step, 2, str(out), timeout_s=120)


@pytest.mark.timeout(300)
def test_trace_has_one_allreduce_per_bucket_ddp_reports(profiled):
    for rank, result in enumerate(profiled):
        timeline = profiling.read_trace(result["trace"], rank)
        assert result["buckets"] >= 3
        assert len(timeline.allreduces) == result["buckets"]


@pytest.mark.timeout(300)
def test_phases_are_in_order_and_overlap_is_a_fraction(profiled):
    timeline = profiling.read_trace(profiled[0]["trace"])
    forward, backward, optimizer = (timeline.phases[p] for p in profiling.PHASES)
    assert 0 == forward.start_s < forward.end_s <= backward.start_s < backward.end_s <= optimizer.start_s
    assert backward.start_s < timeline.gradients_done_s <= backward.end_s
    assert all(backward.start_s <= a.start_s < optimizer.start_s for a in timeline.allreduces)
    assert 0.0 <= profiling.overlap_fraction(timeline) <= 1.0


def test_a_trace_without_the_phases_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "forward", "ts": 0, "dur": 1}]}))
    with pytest.raises(ValueError, match="backward"):
        profiling.read_trace(path)


def test_overlap_counts_only_the_part_inside_backward():
    timeline = profiling.Timeline(0, {"forward": profiling.Interval("forward", 0, 1),
                                      "backward": profiling.Interval("backward", 1, 5),
                                      "optimizer": profiling.Interval("optimizer", 5, 6)}, 4.0,
                                  [profiling.Interval("a", 2, 3), profiling.Interval("b", 3.5, 5.5)])
    assert profiling.overlap_fraction(timeline) == pytest.approx((1 + 0.5) / 3)


def test_modelled_overlap_reads_the_model_timeline():
    step = StepTime(2, 1.0, 2.0, 2.0, 1.0, 0.0, 4.0,
                    {0: [Segment(0, 3, "compute"), Segment(2, 3, "communication"), Segment(3, 4, "communication")]})
    assert profiling.modelled_overlap(step) == pytest.approx(0.5)
    modelled = profiling.modelled_step()
    assert 0.0 <= profiling.modelled_overlap(modelled) <= 1.0


def test_mfu_is_flops_over_time_over_peak():
    setup = profiling.Setup(width=8, depth=2, batch_size=4)
    assert setup.step_flops() == 3 * 2 * (2 * 8 * 8) * 4
    assert profiling.mfu(1e9, 0.5, 4e9) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="positive"):
        profiling.mfu(1.0, 0.0, 1.0)


def _gpu_trace(tmp_path):
    """A synthetic GPU trace, in µs: CPU ranges for the phases (forward 0-100, backward 100-300, optimizer
    300-400), the CPU's nccl:all_reduce launch range, and the kernels: compute 50-250 and 260-380, NCCL 200-300."""
    cpu = [{"ph": "X", "cat": "user_annotation", "name": name, "ts": start, "dur": dur}
           for name, start, dur in (("forward", 1000, 100), ("backward", 1100, 200), ("optimizer", 1300, 100))]
    cpu += [{"ph": "X", "cat": "cpu_op", "name": profiling.LAST_GRADIENT, "ts": 1250, "dur": 10},
            {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "ts": 1150, "dur": 5}]
    kernels = [{"ph": "X", "cat": "kernel", "name": name, "ts": 1000 + start, "dur": dur}
               for name, start, dur in (("ampere_sgemm_128x64_nn", 50, 200), ("ampere_sgemm_64x64_tn", 260, 120),
                                         ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 100))]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": cpu + kernels}))
    return path


def test_a_gpu_trace_reads_the_allreduces_from_nccl_kernels(tmp_path):
    timeline = profiling.read_trace(_gpu_trace(tmp_path))
    assert [a.name for a in timeline.allreduces] == ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]  # not the launch
    assert [(c.start_s, c.end_s) for c in timeline.compute] == [(50e-6, 250e-6), (260e-6, 380e-6)]
    assert timeline.step_s == pytest.approx(400e-6)


def test_old_and_new_nccl_kernel_names_are_communication_and_the_enqueue_range_is_not(tmp_path):
    trace = json.loads(_gpu_trace(tmp_path).read_text())
    for event in trace["traceEvents"]:
        if event["name"].startswith("ncclDevKernel_"):
            event["name"] = "ncclKernel_AllReduce_RING_LL_Sum_float"  # NCCL before 2.19
    (tmp_path / "old.json").write_text(json.dumps(trace))
    timeline = profiling.read_trace(tmp_path / "old.json")
    assert [(a.name, a.start_s, a.end_s) for a in timeline.allreduces] == [
        ("ncclKernel_AllReduce_RING_LL_Sum_float", 200e-6, 300e-6)]  # the kernel, not nccl:all_reduce at 150-155


def test_a_nccl_trace_without_kernels_is_refused_not_read_as_communication(tmp_path):
    trace = json.loads(_gpu_trace(tmp_path).read_text())
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "kernel"]
    (tmp_path / "cpu_only.json").write_text(json.dumps(trace))
    with pytest.raises(ValueError, match="nccl: ranges are the CPU enqueuing kernels, not the communication"):
        profiling.read_trace(tmp_path / "cpu_only.json")


def test_gpu_overlap_is_the_communication_kernels_time_beside_compute_kernels(tmp_path):
    timeline = profiling.read_trace(_gpu_trace(tmp_path))
    assert profiling.overlap_fraction(timeline) == pytest.approx((50 + 40) / 100)  # 200-250 and 260-300 of 200-300


def test_a_cpu_trace_has_no_compute_kernels():
    timeline = profiling.Timeline(0, {p: profiling.Interval(p, i, i + 1) for i, p in enumerate(profiling.PHASES)},
                                  1.5, [profiling.Interval("a", 1.0, 2.0)])
    assert timeline.compute == [] and timeline.step_s == 3


def test_gpus_are_profiled_with_cuda_activity():
    cpu, cuda = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
    assert profiling.activities(torch.device("cpu")) == [cpu]
    assert profiling.activities(torch.device("cuda", 1)) == [cpu, cuda]


def test_the_datasheet_peak_is_the_catalog_entry_of_the_detected_gpu():
    h100 = catalog.match_gpu("NVIDIA H100 80GB HBM3")
    assert profiling.datasheet_peak_flops("NVIDIA H100 80GB HBM3") == (h100.name, h100.peak_flops("fp32"))
    assert profiling.datasheet_peak_flops(None) is None  # a CPU
    assert profiling.datasheet_peak_flops("Some Future GPU") is None


def test_the_matmul_fraction_divides_by_the_measured_rate():
    assert profiling.matmul_fraction(1e9, 0.5, 8e9) == pytest.approx(0.25)
    assert profiling.measured_peak_flops(n=32, repeats=2) > 0


def test_allreduces_that_overlap_each_other_are_summed_and_spanned_and_the_excess_said():
    phases = {"forward": profiling.Interval("forward", 0, 1), "backward": profiling.Interval("backward", 1, 5),
              "optimizer": profiling.Interval("optimizer", 5, 6)}
    crowded = profiling.Timeline(0, phases, 4.0, [profiling.Interval(f"a{i}", 1 + i * 0.5, 5.5) for i in range(3)])
    text = profiling.describe_allreduces(crowded)  # 4.5 + 4 + 3.5 = 12 s summed within a 6 s step, spanning 4.5
    assert "3 allreduces 12000.0 ms summed, spanning 4500.0 ms" in text and "sum exceeds the step" in text
    sparse = profiling.Timeline(0, phases, 4.0, [profiling.Interval("a", 2, 3), profiling.Interval("b", 3.5, 5.5)])
    text = profiling.describe_allreduces(sparse)
    assert "3000.0 ms summed, spanning 3000.0 ms" in text and "exceeds" not in text
