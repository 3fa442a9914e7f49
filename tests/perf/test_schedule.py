"""course.perf.schedule: a recorded bucket schedule replayed on a named cluster, beside torch DDP's defaults."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.ddp import buckets
from course.perf import model as pm
from course.perf import schedule

pytestmark = pytest.mark.unit5

MLP = (40, 1280, 128, 4096, 128, 4096, 128, 8192)  # the DDP lab's MLP, gradients in the order they are ready
BATCH = 8


def bucketed(sizes: tuple[int, ...], cap: int, when: str) -> schedule.Schedule:
    """Buckets of at most ``cap`` launched as ready, after backward, or waited for inside the hook."""
    launches = []
    for bucket in buckets.assign_buckets(sizes, cap):
        nbytes = sum(sizes[i] for i in bucket)
        if when == "after backward":
            launches.append(schedule.Launch(nbytes, len(sizes), after_backward=True))
        else:
            launches.append(schedule.Launch(nbytes, bucket[-1] + 1, blocking=when == "blocking"))
    return schedule.Schedule(sizes, tuple(launches))


def test_the_record_becomes_the_order_of_events():
    ready = [1.0, 2.0, 3.0, 4.0]
    found = schedule.from_record([4, 4, 8, 8], ready, launched=[2.5, 3.2, 5.0], waited=[2.7, 9.0, None],
                                 nbytes=[8, 8, 8], backward_end=4.5)
    assert found.launches == (schedule.Launch(8, 2, False, True),   # waited for before gradient 3 was ready
                              schedule.Launch(8, 3, False, False),
                              schedule.Launch(8, 4, True, False))    # launched once backward had returned
    with pytest.raises(ValueError, match="one ready time per gradient"):
        schedule.from_record([4], [], [], [], [], 0.0)


def test_ddp_fills_a_first_bucket_of_1_mib_then_25_mib_and_launches_each_when_full():
    mib = 2**20
    ddp = schedule.ddp_schedule([mib // 2, mib // 2, mib, 20 * mib, 10 * mib])
    assert ddp.launches == (schedule.Launch(mib, 2), schedule.Launch(21 * mib, 4), schedule.Launch(10 * mib, 5))
    assert len(schedule.ddp_schedule(MLP).launches) == 1  # the lab's 18 KB of gradients: one bucket


def test_one_allreduce_after_backward_adds_to_the_step_in_closed_form():
    cluster, world_size = schedule.CLUSTERS["8 H100s over NVLink"]
    one = schedule.Schedule((4096,), (schedule.Launch(4096, 1, True),))
    step = schedule.step_time(one, "8 H100s over NVLink", BATCH)
    layer, a = schedule.gradient_layer(4096), pm.Assumptions()
    compute = pm.layer_seconds(layer, BATCH, cluster.gpu, a) + pm.layer_seconds(layer, BATCH, cluster.gpu, a, 2.0)
    allreduce = min(pm.allreduce_seconds(4096, world_size, cluster, name) for name in ("ring", "pipelined_tree"))
    update = pm.update_seconds(1024, cluster.gpu, a)
    assert step.step_s == pytest.approx(compute + allreduce + update)
    assert step.exposed_comm_s == pytest.approx(allreduce) and step.comm_s == pytest.approx(allreduce)


@pytest.mark.parametrize("cluster", sorted(schedule.CLUSTERS))
def test_launching_after_backward_is_modelled_slower_than_overlapping(cluster):
    overlapped = schedule.step_time(bucketed(MLP, 4224, "as ready"), cluster, BATCH)
    late = schedule.step_time(bucketed(MLP, 4224, "after backward"), cluster, BATCH)
    blocking = schedule.step_time(bucketed(MLP, 4224, "blocking"), cluster, BATCH)
    assert overlapped.step_s < late.step_s and overlapped.step_s < blocking.step_s
    assert overlapped.comm_s == pytest.approx(late.comm_s)  # the same allreduces, only later


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(4, 2**24).map(lambda n: n // 4 * 4), min_size=1, max_size=12),
       cap=st.integers(2**10, 2**26), cluster=st.sampled_from(sorted(schedule.CLUSTERS)))
def test_overlap_never_loses_to_the_same_buckets_after_backward(sizes, cap, cluster):
    sizes = tuple(sizes)
    early = schedule.step_time(bucketed(sizes, cap, "as ready"), cluster, BATCH)
    late = schedule.step_time(bucketed(sizes, cap, "after backward"), cluster, BATCH)
    blocking = schedule.step_time(bucketed(sizes, cap, "blocking"), cluster, BATCH)
    assert early.step_s <= late.step_s + 1e-12 and early.step_s <= blocking.step_s + 1e-12
    assert early.compute_s == pytest.approx(late.compute_s) == pytest.approx(blocking.compute_s)


def test_comparison_and_grading():
    comparison = schedule.compare(bucketed(MLP, 4224, "after backward"), "4 nodes over InfiniBand", BATCH)
    assert comparison.ratio == pytest.approx(comparison.student.step_s / comparison.ddp.step_s)
    assert comparison.ratio > 1
    text = str(comparison)
    assert text.startswith("4 nodes over InfiniBand: yours ") and f"({comparison.ratio:.2f}x;" in text
    assert schedule.SpeedGrading(within=comparison.ratio).judge(comparison)
    assert not schedule.SpeedGrading(within=comparison.ratio * 0.99).judge(comparison)
    assert schedule.SpeedGrading().points == 0  # informational unless an instructor gives it points
    with pytest.raises(KeyError, match="known"):
        schedule.step_time(bucketed(MLP, 4224, "as ready"), "a laptop", BATCH)
