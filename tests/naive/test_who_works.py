"""course.naive.who_works: the clocked runs on 4 ranks (one shared launch), the GPU model against its closed form."""

import math

import naive_ranks
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from course.collectives import cost_model
from course.monitor.sampling import History, Reading
from course.naive import who_works

RATE, LINK = 0.5e12, cost_model.AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)  # 1 TFLOP/s at 50%, 1 GB/s


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_strategies_train_like_one_process_and_the_clocks_say_who_computed():
    report = naive_ranks.report()
    config = naive_ranks.PS
    losses, _ = naive_ranks.one_process("adam")
    for rank, result in enumerate(report):
        for strategy in who_works.STRATEGIES:
            run = result["who"][strategy]
            assert run["losses"] == pytest.approx(losses, rel=1e-4)
            assert len(run["step_s"]) == len(run["compute_s"]) == config.steps - 1  # the first step is warm-up
            assert all(s >= c >= 0 for s, c in zip(run["step_s"], run["compute_s"], strict=True))
        # rank 0 alone: only rank 0 ever computes; data parallelism: every rank does
        assert (sum(result["who"]["rank0"]["compute_s"]) > 0) == (rank == 0)
        assert sum(result["who"]["ranks"]["compute_s"]) > 0
        assert result["who"]["then"] == 5  # the rank function run after both, in the same launch
        start, end = result["who"]["phases"]["rank0"]
        assert start < end <= result["who"]["phases"]["ranks"][0]
        for strategy in who_works.STRATEGIES:  # the phase is the timed steps' span: it holds them, warm-up excluded
            span_start, span_end = result["who"]["phases"][strategy]
            assert span_end - span_start >= sum(result["who"][strategy]["step_s"])
    shares = who_works.shares([r["who"]["rank0"] for r in report])
    assert shares[0].compute_fraction > 0 and all(s.compute_fraction == 0 for s in shares[1:])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rank0_alone_trains_like_one_process_on_every_rank():
    report = naive_ranks.report()
    losses, expected = naive_ranks.one_process("sgd")
    for rank in report:  # rank 0 does all the work and broadcasts: the same training, on every rank
        assert torch.allclose(rank["rank0"]["params"], expected, atol=1e-6)
        assert rank["rank0"]["losses"] == pytest.approx(losses, rel=1e-5)


def test_modelled_step_matches_the_closed_forms():
    flops, params, n, batch = 1e9, 4e6, 4, 64
    rate, link = RATE, LINK
    alone = who_works.modelled_step("rank0", n, batch, flops, params, RATE, LINK)
    broadcast = 2 * (1e-5 + params / 1e9)  # ceil(log2 4) = 2 tree steps of the whole parameters
    assert alone[0] == who_works.ModelledDevice(pytest.approx(3 * flops * batch / rate), pytest.approx(broadcast), 0.0)
    assert all(d.compute_s == 0 and d.idle_s == pytest.approx(alone[0].compute_s) for d in alone[1:])
    shared = who_works.modelled_step("ranks", n, batch, flops, params, RATE, LINK)
    assert len(shared) == n and shared[0].compute_s == pytest.approx(alone[0].compute_s / n)
    assert shared[0].communicate_s == pytest.approx(float(cost_model.predict("ring", params, n, link)))
    single = who_works.modelled_step("ranks", 1, batch, flops, params, RATE, LINK)
    assert single[0].communicate_s == 0 and single[0].compute_s == pytest.approx(alone[0].compute_s)


def test_modelled_step_refuses_bad_inputs():
    with pytest.raises(ValueError, match="strategy must be one of"):
        who_works.modelled_step("ps", 4, 64, 1e9, 1e6, RATE, LINK)
    with pytest.raises(ValueError, match="world_size"):
        who_works.modelled_step("ranks", 0, 64, 1e9, 1e6, RATE, LINK)
    with pytest.raises(ValueError, match="positive"):
        who_works.modelled_step("ranks", 4, 64, 0.0, 1e6, RATE, LINK)
    with pytest.raises(ValueError, match="flop_rate must be positive"):
        who_works.modelled_step("ranks", 4, 64, 1e9, 1e6, 0.0, LINK)


def test_cpu_while_training_averages_each_device_inside_each_phase():
    history = History(kind="process", readings=[Reading(t, d, 10.0 * d + t, 0) for t in range(10) for d in range(2)])
    means = who_works.cpu_while_training(history, {"rank0": (1.5, 4.0), "ranks": (20.0, 21.0)})
    assert means["rank0"] == [pytest.approx(3.0), pytest.approx(13.0)]  # readings at t = 2, 3, 4
    assert all(math.isnan(v) for v in means["ranks"])


def test_describe_names_who_computed_and_flags_an_impossible_speedup():
    def run(step, compute):
        return {"step_s": [step] * 5, "compute_s": [compute] * 5}
    measured = {"rank0": who_works.shares([run(0.04, 0.036)] + [run(0.04, 0.0)] * 3),
                "ranks": who_works.shares([run(0.01, 0.009)] * 4)}
    text = who_works.describe(measured, cores=2)
    assert "GPU 0 computes 90% of each step, the other GPUs 0% at most" in text
    assert "every GPU computes 90%-90%" in text
    assert "4.00x" in text and "noise" in text
    slower = {"rank0": measured["rank0"], "ranks": who_works.shares([run(0.08, 0.01)] * 4)}
    assert "slower than the baseline" in who_works.describe(slower, cores=2)


@given(worker=st.floats(1.0, 100.0), idle=st.lists(st.floats(0.0, 100.0), min_size=3, max_size=3))
def test_describe_waiting_cpu_follows_the_readings(worker, idle):
    text = who_works.describe_waiting_cpu({"rank0": [worker, *idle], "ranks": [worker] * 4})
    assert ("use CPU too" in text) == (max(idle) >= 0.5 * worker)
    assert ("use little CPU" in text) == (max(idle) < 0.5 * worker)


def test_describe_waiting_cpu_gives_no_verdict_without_readings():
    text = who_works.describe_waiting_cpu({"rank0": [50.0, math.nan, 1.0, 1.0]})
    assert "no verdict" in text and "little CPU" not in text and "CPU too" not in text


def test_describe_waiting_cpu_gives_no_verdict_when_the_monitor_found_no_ranks():
    assert "no verdict" in who_works.describe_waiting_cpu({"rank0": [], "ranks": []})
    assert "no verdict" in who_works.describe_waiting_cpu({"rank0": [80.0], "ranks": [40.0]})


@pytest.mark.parametrize(("alone", "shared", "words"), [
    (104.0, 59.0, "1.76x on 4 GPUs (44% of the ideal 4x): faster, but far from the ideal 4x"),
    (100.0, 30.0, "3.33x on 4 GPUs (83% of the ideal 4x): it pays off"),
    (100.0, 120.0, "no faster"),
])
def test_a_speedup_is_judged_against_the_ideal(alone, shared, words):
    assert words in who_works.speedup_in_words(alone, shared, 4)
