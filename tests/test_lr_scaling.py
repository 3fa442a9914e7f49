"""course.lr_scaling: scaling rules and warmup (exact), the sweep (LARS itself: test_lars.py)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course import data
from course import lr_scaling as ls

pytestmark = [pytest.mark.unit2, pytest.mark.usefixtures("one_thread")]



def test_rules_on_known_values():
    assert ls.scaled_lr(0.1, 32, 256, "none") == 0.1
    assert ls.scaled_lr(0.1, 32, 256, "linear") == pytest.approx(0.8)
    assert ls.scaled_lr(0.1, 32, 128, "sqrt") == pytest.approx(0.2)
    assert ls.scaled_lr(0.1, 256, 32, "linear") == pytest.approx(0.0125)  # scaling down works too


@settings(max_examples=100, deadline=None)
@given(base_lr=st.floats(0, 10), base=st.integers(1, 4096), k=st.integers(1, 64))
def test_rules_scale_by_k_sqrt_k_and_1(base_lr, base, k):
    assert ls.scaled_lr(base_lr, base, base * k, "linear") == pytest.approx(base_lr * k)
    assert ls.scaled_lr(base_lr, base, base * k, "sqrt") == pytest.approx(base_lr * math.sqrt(k))
    assert ls.scaled_lr(base_lr, base, base * k, "none") == base_lr


@pytest.mark.parametrize("step, warmup, factor", [
    (0, 5, 0.2), (1, 5, 0.4), (3, 5, 0.8), (4, 5, 1.0), (50, 5, 1.0),  # 1/5, 2/5, ... then held at 1
    (0, 4, 0.25), (2, 4, 0.75), (0, 1, 1.0), (0, 0, 1.0), (7, 0, 1.0),  # no warmup: the full rate at once
])
def test_warmup_factor_on_known_values(step, warmup, factor):
    assert ls.warmup_factor(step, warmup) == pytest.approx(factor, rel=1e-15)


@settings(max_examples=100, deadline=None)
@given(step=st.integers(0, 1000), warmup=st.integers(1, 200))
def test_warmup_rises_in_equal_steps_to_one_then_holds(step, warmup):
    factor, following = ls.warmup_factor(step, warmup), ls.warmup_factor(step + 1, warmup)
    assert 0 < factor <= following <= 1  # never decreases, never exceeds the full rate
    if step + 1 < warmup:  # during warmup every step adds the same 1 / warmup of the rate
        assert following - factor == pytest.approx(1 / warmup)
    else:
        assert factor == following == 1.0


def test_scheduler_follows_the_pure_function_exactly():
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=ls.scaled_lr(0.1, 32, 256, "linear"))
    scheduler = ls.warmup_scheduler(optimizer, warmup_steps=5)
    seen = []
    for _ in range(8):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([ls.lr_at(s, 0.1, 32, 256, "linear", 5) for s in range(8)], rel=1e-12)
    assert seen[0] == pytest.approx(0.8 / 5) and seen[4:] == pytest.approx([0.8] * 4)


@pytest.mark.parametrize("call, message", [
    (lambda: ls.scaled_lr(-0.1, 32, 64), "lr must be a finite number >= 0"),
    (lambda: ls.scaled_lr(0.1, 32, 0), "global_batch_size must be a positive integer"),
    (lambda: ls.scaled_lr(0.1, 0, 32), "base_batch_size must be a positive integer"),
    (lambda: ls.scaled_lr(0.1, 32, 64, "cubic"), "unknown rule 'cubic'"),
    (lambda: ls.warmup_factor(-1, 5), ">= 0"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def digits_like(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A separable toy problem shaped like the digits: the label is written into pixel (0, label)."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.randint(10, (n,), generator=generator)
    x = 0.1 * torch.rand(n, 1, 8, 8, generator=generator)
    x[torch.arange(n), 0, y // 8, y % 8] += 1.0
    return x, y


def test_train_run_reaches_the_target_and_reports_epochs():
    train, val = digits_like(256), digits_like(64, seed=1)
    config = ls.SweepConfig(base_lr=0.5, base_batch_size=32, max_steps=100, target_accuracy=0.9)
    result = ls.train_run(train, val, 32, "linear", 0, config)
    assert result.steps_to_target is not None and not result.diverged
    assert result.epochs_to_target == pytest.approx(result.steps_to_target * 32 / 256)
    assert len(result.losses) == result.steps_to_target  # stopped at the target


def test_sweep_covers_the_grid_in_order_and_warmup_tames_a_huge_rate():
    splits = data.load()
    train, val = ls.tensors(splits.train, torch.device("cpu")), ls.tensors(splits.val, torch.device("cpu"))
    config = ls.SweepConfig(global_batch_sizes=(8, 512), rules=("none", "linear"), warmup_steps=(0, 10), base_lr=0.1,
                            base_batch_size=8, max_steps=20, stop_at_target=False)
    results = ls.sweep(train, val, config)
    assert [(r.global_batch_size, r.rule, r.warmup_steps) for r in results] == [
        (b, rule, w) for b in (8, 512) for rule in ("none", "linear") for w in (0, 10)]
    cold, warm = results[6], results[7]  # batch 512, linear rule: lr 6.4, without and with warmup
    assert cold.lr == warm.lr == pytest.approx(6.4)
    assert max(cold.losses) > 2 * math.log(10) > max(warm.losses)  # the cold start blows up, the warm one never


def test_train_run_rejects_a_batch_larger_than_the_data_or_zero():
    train, val = digits_like(64), digits_like(16)
    expected = "global_batch_size must be an integer number of training samples from 1 to 64, got"
    with pytest.raises(ValueError, match=expected + " 65"):
        ls.train_run(train, val, 65, "linear", 0)
    with pytest.raises(ValueError, match=expected + " 0"):
        ls.train_run(train, val, 0, "linear", 0)


def test_same_epochs_gives_bigger_batches_fewer_steps():
    train, val = digits_like(256), digits_like(64, seed=1)
    small, big = ls.same_epochs(train, val, (16, 128), epochs=2, config=ls.SweepConfig(base_batch_size=16))
    assert (len(small.losses), len(big.losses)) == (32, 4)


def test_checker_accepts_the_answer_and_rejects_a_wrong_one(capsys):
    def answer(step, base_lr, base_batch_size, global_batch_size, warmup_steps):
        lr = base_lr * global_batch_size / base_batch_size
        return lr if warmup_steps == 0 else lr * min(1.0, (step + 1) / warmup_steps)

    assert ls.check_warmup_exercise(answer)
    assert "Correct" in capsys.readouterr().out
    assert not ls.check_warmup_exercise(lambda step, base_lr, base_b, b, warm: base_lr * b / base_b)
    assert "expected" in capsys.readouterr().out


def test_warmup_checker_reports_the_notebook_stub_as_not_attempted(capsys):
    def stub(step, base_lr, base_batch_size, global_batch_size, warmup_steps):
        raise NotImplementedError("write linear_with_warmup")

    assert not ls.check_warmup_exercise(stub)
    assert capsys.readouterr().out.startswith("Not attempted yet")


def test_scaling_efficiency_is_one_for_perfect_scaling_and_drops_after():
    def run(global_batch_size, steps):
        return ls.RunResult(global_batch_size, "linear", 0, 0.1, steps, None, False, 1.0, 1.0, 0.0, 0.0, [])

    results = [run(8, 100), run(16, 50), run(32, 50), run(64, None), run(128, 10)]
    assert ls.scaling_efficiency(results, "linear", 0) == pytest.approx({8: 1.0, 16: 1.0, 32: 0.5,
                                                                         128: 800 / 1280})
    assert ls.scaling_efficiency(results, "sqrt", 0) == {}


def test_without_warmup_the_largest_linear_rate_diverges_and_with_warmup_it_trains():
    # The warmup demo of notebook 02: global batch 1024, linear rule from 0.1 at batch 8 (lr 12.8).
    splits = data.load()
    train, val = ls.tensors(splits.train, torch.device("cpu")), ls.tensors(splits.val, torch.device("cpu"))
    config = ls.SweepConfig(base_lr=0.1, base_batch_size=8, max_steps=100, target_accuracy=0.95,
                            diverged_loss=4 * math.log(10))
    cold = ls.train_run(train, val, 1024, "linear", 0, config)
    warm = ls.train_run(train, val, 1024, "linear", 8, config)
    assert cold.lr == warm.lr == pytest.approx(12.8)
    assert cold.diverged and cold.steps_to_target is None
    assert len(cold.losses) < 10 and cold.losses[-1] > config.diverged_loss  # stopped at the first blow-up
    assert not warm.diverged and warm.steps_to_target is not None
    assert max(warm.losses) < config.diverged_loss
    assert warm.steps_to_target > 8  # the notebook's claim: it trains on past its warmup, at the peak rate


def test_describe_rule_follows_the_steps_to_target():
    def run(global_batch_size, steps, rule="none"):
        return ls.RunResult(global_batch_size, rule, 0, 0.1, steps, None, False, 1.0, 1.0, 0.0, 0.0, [])

    flat = [run(8, 792), run(16, 802), run(32, None), run(64, None)]
    text = ls.describe_rule(flat, "none", 0, 1000)
    assert text == ("none rule: batch 8: 792 steps, batch 16: 802 steps; missed the target within 1000 steps at "
                    "batch 32, 64: bigger batches do not cut the steps")
    falling = [run(8, 800, "linear"), run(16, 410, "linear")]
    assert ls.describe_rule(falling, "linear", 0, 1000).endswith("bigger batches cut the steps")
    with pytest.raises(ValueError, match="no runs with rule 'sqrt'"):
        ls.describe_rule(falling, "sqrt", 0, 1000)


def test_same_train_accuracy_stops_each_run_at_the_training_threshold():
    train, val = digits_like(256), digits_like(64, seed=1)
    config = ls.SweepConfig(base_lr=0.5, base_batch_size=32, max_steps=200)
    runs = ls.same_train_accuracy(train, val, (16, 64), train_accuracy=0.9, rule="linear", warmup_steps=0,
                                  config=config)
    for run in runs:
        assert 1 < run.steps_to_target == len(run.losses) and run.train_accuracy >= 0.9
        probe = ls.train_run(train, val, run.global_batch_size, "linear", 0,
                             ls.SweepConfig(base_lr=0.5, base_batch_size=32, max_steps=run.steps_to_target - 1,
                                            stop_at_target=False))
        assert probe.train_accuracy < 0.9  # one step earlier the threshold was not reached yet
    with pytest.raises(ValueError, match="target_split must be 'val' or 'train', got 'test'"):
        ls.SweepConfig(target_split="test")


def test_default_sweep_scales_near_perfectly_for_three_doublings_then_loses_efficiency():
    # What notebook 02's sweep shows for the linear rule with warmup (only that rule is run here, for speed).
    splits = data.load()
    train, val = ls.tensors(splits.train, torch.device("cpu")), ls.tensors(splits.val, torch.device("cpu"))
    results = ls.sweep(train, val, ls.SweepConfig(rules=("linear",), warmup_steps=(10,)))
    efficiency = ls.scaling_efficiency(results, "linear", 10)
    assert list(efficiency) == [8, 16, 32, 64, 128, 256, 512, 1024]  # every batch size reached the target
    assert min(efficiency[b] for b in (8, 16, 32, 64)) >= 0.9
    assert efficiency[128] < 0.9 and efficiency[1024] < 0.5
    assert efficiency[1024] < efficiency[256] < efficiency[128]  # diminishing returns


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_steps=0), r"max_steps must be a positive integer, got 0"),
    (dict(max_steps=-5), r"max_steps must be a positive integer, got -5"),
    (dict(global_batch_sizes=()), r"global_batch_sizes is empty"),
    (dict(global_batch_sizes=(16, 0)), r"each batch size must be a positive integer number of samples, got 0"),
    (dict(warmup_steps=(-1,)), r"warmup_steps must be an integer >= 0, got -1"),
    (dict(rules=("linear", "cubic")), r"unknown rules \['cubic'\]"),
])
def test_sweep_config_refuses_settings_that_cannot_train(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ls.SweepConfig(**kwargs)


def test_train_run_refuses_data_the_model_cannot_take():
    train, val = digits_like(32), digits_like(16, seed=1)
    with pytest.raises(ValueError, match=r"training samples have shape \(1, 8, 8\) but validation samples \(1, 7, 7\)"):
        ls.train_run(train, (val[0][:, :, :7, :7], val[1]), 8, "linear", 0)
    with pytest.raises(ValueError, match=r"labels must be in 0..9 .* got labels from 3 to 12"):
        ls.train_run((train[0], train[1] + 3), val, 8, "linear", 0)
    with pytest.raises(ValueError, match=r"one sample has shape \(1, 1, 8, 8\)"):
        ls.train_run((train[0].unsqueeze(1), train[1]), (val[0].unsqueeze(1), val[1]), 8, "linear", 0,
                     ls.SweepConfig(model="cnn"))


@pytest.mark.parametrize("epochs", [0, -1])
def test_same_epochs_refuses_a_non_positive_number_of_epochs(epochs):
    with pytest.raises(ValueError, match=f"epochs must be a positive integer, got {epochs}"):
        ls.same_epochs(digits_like(32), digits_like(16), (8,), epochs=epochs)


def test_numpy_integers_are_accepted_as_batch_sizes_and_warmup():
    train, val = digits_like(64), digits_like(16, seed=1)
    config = ls.SweepConfig(base_lr=0.5, base_batch_size=np.int64(16), max_steps=np.int64(3), stop_at_target=False)
    run = ls.train_run(train, val, np.int64(16), "linear", np.int64(2), config)
    assert len(run.losses) == 3 and run.global_batch_size == 16 and type(run.global_batch_size) is int
