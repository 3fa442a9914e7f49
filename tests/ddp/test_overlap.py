"""course.ddp.overlap: recorded steps are well-formed (2 ranks, shared launch), the GPU model against hand-made
cases."""

import distributed_optimizer_ranks
import pytest

from course.collectives import cost_model
from course.ddp import buckets, overlap
from course.timing import Estimate

pytestmark = pytest.mark.unit4

LINK = cost_model.AlphaBeta(alpha_s=1e-3, beta_s_per_byte=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_record_steps_keeps_every_timed_step_in_order():
    for rank in distributed_optimizer_ranks.report():
        recorded = rank["steps"]
        assert set(recorded) == {1024, 1 << 30} and all(len(steps) == 2 for steps in recorded.values())
        assert all(len(t["allreduces"]) == 1 for t in recorded[1 << 30])  # one bucket holds every gradient
        assert all(len(t["allreduces"]) > 1 for t in recorded[1024])
        for steps in recorded.values():
            for t in steps:
                assert 0 <= min(t["grads"]) and max(t["grads"]) <= t["backward_end"] <= t["step_end"]
                assert all(0 <= a <= b <= t["step_end"] for a, b in t["allreduces"])
        summaries = overlap.summarize_steps(recorded)
        assert [s.bucket_bytes for s in summaries] == [1024, 1 << 30] and summaries[1].allreduces == 1


def test_overlapped_fraction_counts_only_communication_before_backward_ended():
    timeline = {"backward_end": 10.0, "allreduces": [(6.0, 8.0), (9.0, 13.0), (14.0, 16.0)]}
    assert overlap.overlapped_fraction(timeline) == pytest.approx((2 + 1) / (2 + 4 + 2))
    assert overlap.overlapped_fraction({"backward_end": 1.0, "allreduces": []}) == 0.0
    # with gradient times, computing ends at the last one: an allreduce after it overlaps nothing
    late = {"backward_end": 10.0, "grads": [2.0, 5.0], "allreduces": [(5.0, 9.0)]}
    assert overlap.overlapped_fraction(late) == 0.0


def test_modelled_timeline_sends_each_bucket_when_ready_and_the_link_is_free():
    grads = [1000, 1000, 1000, 1000]  # gradients final at 1, 2, 3, 4 s of a 4 s backward
    one_each = overlap.modelled_timeline(grads, 4.0, bucket_bytes=1000, world_size=2, link=LINK)
    cost = float(cost_model.predict("ring", 1000, 2, LINK))  # 2·α + 1·1000·β = 3 ms
    assert one_each["allreduces"][0] == pytest.approx((1.0, 1.0 + cost))
    assert [a for a, _ in one_each["allreduces"]] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert one_each["step_end"] == pytest.approx(4.0 + cost)
    whole = overlap.modelled_timeline(grads, 4.0, bucket_bytes=10_000, world_size=2, link=LINK, update_s=0.5)
    assert whole["allreduces"] == [pytest.approx((4.0, 4.0 + float(cost_model.predict("ring", 4000, 2, LINK))))]
    assert overlap.overlapped_fraction(whole) == 0.0
    assert whole["step_end"] == pytest.approx(whole["allreduces"][0][1] + 0.5)
    assert len(one_each["allreduces"]) == len(buckets.assign_buckets(grads, 1000))


def test_modelled_timeline_queues_buckets_behind_a_busy_link():
    slow = cost_model.AlphaBeta(alpha_s=1.0, beta_s_per_byte=0.0)  # 2 s per allreduce on 2 ranks
    t = overlap.modelled_timeline([8, 8], 2.0, bucket_bytes=8, world_size=2, link=slow)
    assert t["allreduces"] == [pytest.approx((1.0, 3.0)), pytest.approx((3.0, 5.0))]


def test_modelled_timeline_refuses_bad_inputs():
    with pytest.raises(ValueError, match="number of gradients"):
        overlap.modelled_timeline([], 1.0, 1024, 4, LINK)
    with pytest.raises(ValueError, match="backward_s"):
        overlap.modelled_timeline([8], 0.0, 1024, 4, LINK)


def test_describe_follows_the_measurement():
    def summary(bucket_bytes, fraction, steps):
        return overlap.OverlapSummary(bucket_bytes, 1, Estimate(fraction, fraction, fraction, 3),
                                      Estimate(0.01, 0.01, 0.01, 3), Estimate(steps[1], min(steps), max(steps), 3),
                                      tuple(steps))
    slower = overlap.describe(summary(16384, 0.13, [0.2, 0.21, 0.22]), summary(1 << 25, 0.0, [0.11, 0.111, 0.112]))
    assert "overlapped 13%" in slower and "SLOWER with 16 KiB buckets" in slower
    near = overlap.describe(summary(16384, 0.13, [0.13, 0.132, 0.134]), summary(1 << 25, 0.0, [0.11, 0.111, 0.112]))
    assert "cannot be told apart" in near and "SLOWER" not in near  # 0.84x: inside the band load moves it in
    same = overlap.describe(summary(16384, 0.4, [0.1, 0.2, 0.3]), summary(1 << 25, 0.0, [0.1, 0.2, 0.3]))
    assert "cannot be told apart" in same
