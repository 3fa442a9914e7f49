"""course.practice.profiling: the timeline read back from each rank's trace file agrees with DDP and the model."""

import json

import pytest

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
