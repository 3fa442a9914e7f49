"""course.memory.budget and course.memory.measure: the estimate against the ZeRO paper's published figures, and
against the bytes of real tensors after a real optimizer step (exact)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.memory import budget as mb
from course.memory import measure as mm
from course.models import MLP, DigitsCNN

GB = 1e9


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    # ZeRO paper, section 3.1: 2 (fp16 params) + 2 (fp16 grads) + K = 12 (fp32 params, momentum, variance)
    unit = mb.bytes_per_parameter(mb.Setup("adam", "fp16"))
    assert (unit.parameters, unit.gradients, unit.optimizer_state) == (2, 2, 12)


@pytest.mark.parametrize(("stage", "published_gb"), [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_stages_match_figure_1(stage, published_gb):
    # ZeRO paper, Figure 1: Ψ = 7.5 B parameters, K = 12, N_d = 64 GPUs
    got = mb.model_states(7.5e9, mb.Setup("adam", "fp16", stage, 64)).model_states / GB
    assert got == pytest.approx(published_gb, rel=0.10)


def test_zero_3_on_1024_gpus_fits_a_trillion_parameters_in_16_gb():
    # ZeRO paper, section 1 / Table 1: 1 T parameters on 1024 GPUs with P_os+g+p need 16 GB per GPU
    assert mb.model_states(1e12, mb.Setup("adam", "fp16", 3, 1024)).model_states / GB == pytest.approx(15.6, rel=0.1)


@given(params=st.integers(1, 10**12), world_size=st.integers(1, 4096),
       optimizer=st.sampled_from(list(mb.STATE_TENSORS)), precision=st.sampled_from(list(mb.PRECISION_BYTES)))
@settings(max_examples=50, deadline=None)
def test_stages_only_ever_save_and_stage_3_divides_everything(params, world_size, optimizer, precision):
    totals = [mb.model_states(params, mb.Setup(optimizer, precision, s, world_size)).model_states for s in range(4)]
    assert totals == sorted(totals, reverse=True)
    assert totals[3] * world_size == pytest.approx(totals[0])


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("model_class", [MLP, DigitsCNN])
def test_estimate_equals_real_tensor_bytes_after_a_step(model_class, optimizer, precision):
    torch.manual_seed(0)
    model = model_class()
    params = list(model.parameters())
    inputs, labels = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    if precision == "fp32":
        measured = mm.fp32_step(model, optimizer, inputs, labels)
    else:
        measured = mm.mixed_precision_step(model, optimizer, inputs, labels, precision)
    estimate = mb.model_states(sum(p.numel() for p in params), mb.Setup(optimizer, precision), len(params))
    assert measured == estimate


def test_mixed_precision_step_moves_the_weights_like_fp32():
    torch.manual_seed(0)
    fp32, mixed = MLP(), MLP()
    mixed.load_state_dict(fp32.state_dict())
    inputs, labels = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    mm.fp32_step(fp32, "sgd", inputs, labels)
    mm.mixed_precision_step(mixed, "sgd", inputs, labels, "bf16")
    for a, b in zip(fp32.parameters(), mixed.parameters(), strict=True):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), a, atol=0.02, rtol=0.02)  # bf16 keeps 8 bits of mantissa


def test_largest_model_inverts_model_states():
    setup = mb.Setup("adam", "fp16", 2, 64)
    psi = mb.largest_model(32 * GB, setup)
    assert mb.model_states(psi, setup).model_states == pytest.approx(32 * GB)


def test_largest_batch_is_the_last_that_fits():
    setup = mb.Setup("momentum", "fp32")
    batch = mb.largest_batch(16 * GB, 25.6e6, 90e6, setup)
    assert mb.budget(25.6e6, 90e6, batch, setup).total <= 16 * GB < mb.budget(25.6e6, 90e6, batch + 1, setup).total
    assert mb.largest_batch(1e6, 25.6e6, 90e6, setup) == 0  # the model states alone do not fit


def test_checkpointing_keeps_segment_inputs_and_one_segment():
    layers, inputs = [10.0] * 16, [1.0] * 16
    assert mb.checkpointed(layers, inputs, 4) == 4 * 1.0 + 4 * 10.0
    assert mb.checkpointed(layers, inputs, 1) == 1.0 + 160.0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("optimizer", "adamw", "optimizer must be one of"), ("precision", "fp8", "precision must be one of"),
    ("zero_stage", 4, "zero_stage must be one of"),
    ("world_size", 0, "world_size must be a positive integer number of ranks, got 0")])
def test_bad_setup_says_what_is_allowed(field, value, message):
    with pytest.raises(ValueError, match=message):
        mb.Setup(**{field: value})


def test_bad_segments_are_refused():
    with pytest.raises(ValueError, match="segments"):
        mb.checkpointed([1.0, 2.0], [1.0, 2.0], 3)
