"""course.optimization.lr_scaling: scaling rules and warmup against their closed forms, and the warmup exercise
checker."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from course.optimization import lr_scaling as ls


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


def test_adam_gain_is_sqrt_k_when_noise_dominates_and_1_without_noise():
    generator = torch.Generator().manual_seed(0)
    noisy = 0.01 + torch.randn(20000, 3, generator=generator, dtype=torch.float64)  # |G| << noise
    assert ls.adam_step_gain(noisy, 4, 64) == pytest.approx(4.0, rel=0.01)  # sqrt(16)
    no_noise = torch.tensor([[0.5, -2.0, 1.0]] * 10, dtype=torch.float64)
    assert ls.adam_step_gain(no_noise, 4, 64) == pytest.approx(1.0)


@settings(max_examples=50, deadline=None)
@given(mean=st.floats(-2, 2), std=st.floats(0.01, 5), b=st.integers(1, 64), k=st.integers(1, 64))
def test_adam_gain_matches_the_closed_form_for_one_coordinate(mean, std, b, k):
    assume(abs(mean) > 1e-3)
    grads = torch.tensor([[mean - std], [mean + std]], dtype=torch.float64)  # mean `mean`, variance std^2
    closed = math.sqrt(mean ** 2 + std ** 2 / b) / math.sqrt(mean ** 2 + std ** 2 / (b * k))
    assert ls.adam_step_gain(grads, b, b * k) == pytest.approx(closed, rel=1e-6)
    assert 1.0 - 1e-9 <= ls.adam_step_gain(grads, b, b * k) <= math.sqrt(k) + 1e-9


def test_adam_gain_rejects_a_single_sample_and_a_zero_mean():
    with pytest.raises(ValueError, match="N >= 2"):
        ls.adam_step_gain(torch.zeros(1, 3), 1, 2)
    with pytest.raises(ValueError, match="mean of per_sample_grads is zero"):
        ls.adam_step_gain(torch.tensor([[1.0], [-1.0]]), 1, 2)
