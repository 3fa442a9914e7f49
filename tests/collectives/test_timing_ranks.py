"""course.collectives.timing_ranks: timings on every rank, the ping-pong between any two ranks, the measured
crossover."""

from unittest import mock

import pytest

from course.collectives import timing_ranks as at
from course.runtime.launch import launch


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_measure_on_two_ranks_gives_positive_times_for_everything():
    sizes = [4096, 65536]
    result = launch(at.measure, 2, sizes, 2, timeout_s=150)
    assert result[0] == result[1]  # every rank returns the same report
    report = result[0]
    assert report["world_size"] == 2
    assert set(report["ping_pong"]) == set(sizes) and all(t > 0 for t in report["ping_pong"].values())
    assert set(report["allreduce"]) == {"naive", "ring", "tree", at.REFERENCE}
    assert all(t > 0 for times in report["allreduce"].values() for t in times.values())
    every = launch(at.measure, 2, sizes, 3, samples=True, timeout_s=150)[0]  # every repeat, for intervals
    assert all(len(t) == 3 and min(t) > 0 for t in every["ping_pong"].values())
    assert all(len(t) == 3 for times in every["allreduce"].values() for t in times.values())


def test_measured_crossover_interpolates_where_the_curves_cross():
    sizes = [1e3, 1e4, 1e5]
    assert at.measured_crossover(sizes, [1, 1, 1], [2, 1.0000001, 0.5]) == pytest.approx(1e4, rel=1e-3)
    assert at.measured_crossover(sizes, [1, 1, 1], [2, 2, 2]) is None
    assert at.measured_crossover(sizes, [1, 1, 1], [0.5, 0.5, 0.5]) is None


@pytest.mark.timeout(120)
def test_time_allreduce_gives_medians_or_every_round():
    medians, rounds = launch(_both_kinds, 2, timeout_s=100)[0]
    assert set(medians) == set(rounds) == {"ring", at.REFERENCE}
    for name in medians:
        assert set(medians[name]) == set(rounds[name]) == {4096, 65536}
        for size in (4096, 65536):
            assert medians[name][size] > 0
            assert len(rounds[name][size]) == 3 and all(t > 0 for t in rounds[name][size])


def _both_kinds():
    return (at.time_allreduce([4096, 65536], ["ring", at.REFERENCE], repeats=3),
            at.time_allreduce([4096, 65536], ["ring", at.REFERENCE], repeats=3, samples=True))


@pytest.mark.timeout(120)
def test_time_allreduce_back_to_back_calls_report_seconds_per_call():
    calls, seconds = launch(_three_calls_a_round, 2, timeout_s=100)[0]
    assert calls == 2 * 3  # 2 rounds of 3 calls
    assert seconds == 1.0  # each call takes one tick of the fake clock: per call (per round would read 3.0)


_CALLS: list[int] = []
_CLOCK = [0.0]  # a clock that only the calls advance: the verdict cannot depend on the machine's load


def _ticking_allreduce(tensor):
    _CALLS.append(1)
    _CLOCK[0] += 1.0


def _three_calls_a_round():
    with mock.patch.object(at.time, "perf_counter", lambda: _CLOCK[0]):
        medians = at.time_allreduce([4096], {"ticking": _ticking_allreduce}, repeats=2, calls=3)
    return len(_CALLS), medians["ticking"][4096]


@pytest.mark.timeout(120)
def test_ping_pong_sends_only_between_the_two_ranks_it_is_given_and_refuses_others():
    per_rank = launch(_between_ranks_one_and_two, 3, timeout_s=100)
    sent_to = [sent for sent, _, _ in per_rank]
    assert sent_to == [set(), {2}, {1}]  # rank 0 only waits at the barriers
    times, refusal = per_rank[0][1:]
    assert all(result[1:] == (times, refusal) for result in per_rank)  # rank 1's times, on every rank
    assert set(times) == {4096, 65536} and all(len(t) == 2 and min(t) > 0 for t in times.values())
    assert refusal == "between must be two different ranks in 0..2, got (0, 3)."


def _between_ranks_one_and_two():
    with mock.patch.object(at.dist, "send", wraps=at.dist.send) as send:
        times = at.ping_pong([4096, 65536], repeats=2, samples=True, between=(1, 2))
    sent_to = {call.args[1] for call in send.call_args_list}
    try:
        at.ping_pong([4096], between=(0, 3))
    except ValueError as error:
        return sent_to, times, str(error)
    return sent_to, times, None
