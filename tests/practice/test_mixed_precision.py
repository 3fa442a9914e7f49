"""course.practice.mixed_precision: fp16 underflow against closed forms, bytes per parameter against the ZeRO
accounting, and bf16/fp16 training under DDP on 2 gloo ranks."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.memory import budget
from course.practice import mixed_precision as mp
from course.runtime.launch import launch


def test_underflow_closed_form():
    g = torch.tensor([2.0**-30, 2.0**-20, 2.0**-3, 0.0])  # below fp16's range, subnormal, normal, (zero: ignored)
    plain = mp.underflow(g, 1.0)
    assert plain.flushed == pytest.approx(1 / 3) and plain.subnormal == pytest.approx(1 / 3)
    scaled = mp.underflow(g, 2.0**16)  # 2**-14, 2**-4, 2**13: all normal
    assert scaled.flushed == 0 and scaled.subnormal == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-40, 10), min_size=1, max_size=30), st.integers(0, 24))
def test_underflow_counts_the_elements_below_half_the_smallest_fp16(exponents, scale_log2):
    g = torch.tensor([2.0**e for e in exponents], dtype=torch.float64)
    # powers of two: below 2**-25 round to 0 (never exactly 2**-25, a tie that rounds to even, i.e. 0)
    expected = sum(e + scale_log2 <= -25 for e in exponents) / len(exponents)
    assert mp.underflow(g, 2.0**scale_log2).flushed == pytest.approx(expected)


@pytest.mark.parametrize("scale", [0, -1.0, float("inf")])
def test_underflow_rejects_a_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        mp.underflow(torch.ones(3), scale)


def test_underflow_rejects_zero_gradients():
    with pytest.raises(ValueError, match="all zero"):
        mp.underflow(torch.zeros(3))


def test_loss_scaling_rescues_late_gradients():
    g = mp.trained_gradients(steps=30)
    assert mp.underflow(g, 1.0).flushed > mp.underflow(g, 2.0**16).flushed


def test_adam_holds_16_bytes_per_parameter_like_the_zero_accounting():
    model = torch.nn.Linear(100, 10)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 100)).sum().backward()
    optimizer.step()
    state = mp.state_bytes(model, optimizer)
    assert (state.parameters, state.gradients) == (4 * 1010, 4 * 1010)
    assert state.optimizer_state == 8 * 1010 + 4 * 2  # two fp32 moments, plus a 4-byte step counter per tensor
    zero = budget.bytes_per_parameter(budget.Setup("adam", "bf16"))
    assert zero.parameters + zero.gradients + zero.optimizer_state == 16
    assert state.per_parameter == pytest.approx(16 + 8 / 1010)


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match="fp8"):
        mp._check_precision("fp8")


@pytest.fixture(scope="module")
def runs():
    return {(precision, scale): launch(mp.train_ddp, 2, precision, 6, init_scale=scale, timeout_s=300)
            for precision, scale in [("bf16", 1.0), ("fp16", 2.0**24), ("fp16", 2.0**8)]}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_autocast_keeps_parameters_gradients_and_state_fp32(runs):
    for (precision, _), ranks in runs.items():
        dtypes = ranks[0].dtypes
        assert dtypes["logits"] == str(mp.PRECISIONS[precision])
        assert dtypes["parameters"] == dtypes["gradients"] == dtypes["optimizer state"] == "torch.float32"
        assert torch.equal(ranks[0].parameters, ranks[1].parameters)  # DDP: every rank the same model


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grad_scaler_skips_overflowing_steps_on_every_rank_alike(runs):
    huge = runs[("fp16", 2.0**24)]
    # step 0's scaled logit gradient is about 2**24 x 0.9 / 32 per element, 7x fp16's largest 65504: inf
    assert huge[0].skipped[0] == 0 and huge[0].skipped == huge[1].skipped
    assert huge[0].scales[1] == huge[0].scales[0] / 2  # halved after the skip
    assert runs[("fp16", 2.0**8)][0].skipped == []  # gradients x 256 stay far below 65504
