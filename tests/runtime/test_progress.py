"""course.runtime.progress: a job is stuck only when no rank still running makes progress for a window; a rank that
is behind but working is never called stuck. The decision is pure (samples in, verdict out); the sampler reads
/proc."""

import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.runtime import progress
from course.runtime.progress import Sample, Watch, idle_for, judge


def history(cpu_by_rank: dict[int, list[float]], period_s: float = 1.0,
            events: dict[int, list[int]] | None = None) -> list[Sample]:
    """Samples ``period_s`` apart: rank -> its CPU seconds at each sample (and its events, if given)."""
    looks = len(next(iter(cpu_by_rank.values())))
    return [Sample(i * period_s, {r: cpu[i] for r, cpu in cpu_by_rank.items()},
                   {r: e[i] for r, e in (events or {}).items()}) for i in range(looks)]


def test_ranks_blocked_with_no_cpu_for_the_window_are_stuck():
    samples = history({0: [2.0] * 6, 1: [3.0] * 6})  # both blocked in a collective: no CPU for 5 s
    verdict = judge(samples, window_s=5.0)
    assert verdict.stuck and verdict.idle_s == {0: 5.0, 1: 5.0}
    assert not judge(samples, window_s=6.0).stuck  # not for long enough yet


def test_a_slow_rank_that_keeps_using_cpu_is_never_stuck_however_far_behind():
    # rank 1 waits in a collective for rank 0, which is computing, slowly (a tenth of a core): 100 s of samples
    samples = history({0: [0.1 * i for i in range(101)], 1: [1.0] * 101})
    verdict = judge(samples, window_s=20.0)
    assert not verdict.stuck and verdict.busy == [0] and verdict.idle_s[1] == 100.0


def test_counted_work_is_progress_even_without_cpu():
    samples = history({0: [1.0] * 10}, events={0: [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]})
    assert idle_for(samples, 0) == 6.0 and not judge(samples, window_s=7.0).stuck


def test_a_rank_blocked_in_one_wait_for_a_message_is_idle_even_while_its_cpu_spins():
    # on GPUs a rank blocked in nccl may spin a processor: the wait (same events throughout) is the evidence
    spinning = [float(i) for i in range(6)]
    samples = [Sample(i, {0: spinning[i], 1: 2.0}, {0: 7, 1: 3}, frozenset({0})) for i in range(6)]
    assert judge(samples, window_s=5.0).stuck
    unblocked = [Sample(s.t, s.cpu_s, s.events) for s in samples]  # no wait seen: the CPU time is progress
    assert not judge(unblocked, window_s=5.0).stuck
    waits_end = [*samples[:3], *[Sample(s.t, s.cpu_s, {0: 8, 1: 3}, s.blocked) for s in samples[3:]]]
    assert idle_for(waits_end, 0) == 2.0  # another wait began: progress, however briefly


def test_a_rank_seen_waiting_for_a_processor_is_working_even_when_the_machine_gives_it_no_cpu():
    # a crowded machine: rank 0 computes but gets no CPU for 5 s; it is seen runnable (state R), not asleep
    starved = [Sample(float(i), {0: 1.0, 1: 2.0}, runnable=frozenset({0})) for i in range(6)]
    verdict = judge(starved, window_s=5.0)
    assert not verdict.stuck and verdict.idle_s == {0: 0.0, 1: 5.0}
    last_seen = [*starved[:3], *[Sample(s.t, s.cpu_s) for s in starved[3:]]]  # runnable until t=2, asleep since
    assert idle_for(last_seen, 0) == 3.0
    spinning_in_a_wait = [Sample(s.t, s.cpu_s, {0: 7}, frozenset({0}), s.runnable) for s in starved]
    assert idle_for(spinning_in_a_wait, 0) == 5.0  # blocked in one wait throughout: the wait is the evidence


def test_cpu_within_the_tolerance_is_no_progress():
    samples = history({0: [1.0, 1.01, 1.02, 1.03]})  # a blocked rank's background threads: a few ticks
    assert judge(samples, window_s=3.0, idle_cpu_s=0.05).stuck
    assert not judge(samples, window_s=3.0, idle_cpu_s=0.0).stuck  # 0.03 s is more than 1% of 3 s


def test_a_rank_blocked_in_gloo_is_stuck_after_the_window_though_gloos_thread_wakes_up():
    # measured on a grader run: a rank blocked in a gloo barrier used 0.05-0.06 s of CPU in 20 s (gloo's TCP loop)
    samples = history({0: [0.003 * t for t in range(31)], 1: [2.0 + 0.0027 * t for t in range(31)]})
    verdict = judge(samples, window_s=20.0)
    assert verdict.stuck and verdict.idle_s == {0: 30.0, 1: 30.0}
    working = history({0: [0.05 * t for t in range(31)]})  # a rank given 5% of a core on a crowded machine
    assert not judge(working, window_s=20.0).stuck


def test_ranks_that_ended_are_not_judged_and_no_rank_left_is_not_stuck():
    samples = [Sample(0.0, {0: 1.0, 1: 1.0}), Sample(10.0, {1: 5.0}), Sample(20.0, {})]
    assert judge(samples[:2], window_s=5.0).idle_s == {1: 0.0}
    assert judge(samples, window_s=5.0) == progress.Verdict(False, {})


def test_a_rank_not_seen_before_counts_from_its_first_sample():
    samples = [Sample(0.0, {0: 1.0}), Sample(10.0, {0: 1.0, 1: 2.0}), Sample(12.0, {0: 1.0, 1: 2.0})]
    assert judge(samples, window_s=5.0).idle_s == {0: 12.0, 1: 2.0}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one Sample"):
        judge([])
    with pytest.raises(ValueError, match="window_s must be a positive"):
        judge([Sample(0.0, {0: 1.0})], window_s=0)


@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=40), st.floats(0.5, 30.0))
def test_a_rank_using_more_cpu_than_the_tolerance_each_window_is_never_stuck(steps, window_s):
    # whatever its pace, a rank whose CPU grows by more than the tolerance within every window is not stuck
    cpu, total = [], 0.0
    for step in steps:
        total += progress.tolerance(1.0) * 1.01 + step  # per sample, 1 s apart: more than the tolerance each time
        cpu.append(total)
    assert not judge(history({0: cpu}), window_s=window_s).stuck


def test_the_watch_keeps_only_the_samples_one_window_needs():
    watch = Watch(window_s=5.0)
    for t in range(100):
        verdict = watch.add(Sample(float(t), {0: 1.0}))
    assert verdict.stuck and verdict.idle_s == {0: 5.0} and len(watch.samples) <= 7


def test_the_sampler_sees_a_busy_process_and_its_children_progress_and_runnable_and_a_sleeping_one_not():
    busy = ("import os, time\nif os.fork() == 0:\n    end = time.process_time() + 60\n"
            "    while time.process_time() < end: pass\ntime.sleep(60)")  # the parent sleeps, its child works
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (busy, "import time; time.sleep(60)")]
    try:
        time.sleep(1.0)  # both have started (the sleeper is then asleep for good)
        watch = Watch(window_s=60.0)
        first = watch.look({0: procs[0].pid, 1: procs[1].pid})
        before = {rank: watch.samples[-1].cpu_s[rank] for rank in (0, 1)}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # however loaded the machine, the busy child gets some CPU at last
            time.sleep(0.5)
            verdict = watch.look({0: procs[0].pid, 1: procs[1].pid})
            if watch.samples[-1].cpu_s[0] - before[0] > progress.tolerance(60.0):
                break
        assert first.idle_s == {0: 0.0, 1: 0.0}
        assert watch.samples[-1].runnable == {0}  # the busy child always wants a processor; the sleeper never
        assert verdict.idle_s[0] == 0.0 and verdict.idle_s[1] > 0.0  # the sleeper: no progress since it slept
        assert watch.samples[-1].cpu_s[1] - before[1] <= progress.IDLE_CPU_S  # asleep: not even the floor
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
