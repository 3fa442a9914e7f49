"""course.memory.activations: the per-layer estimate against what autograd really saves (saved_tensors_hooks)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course.memory import activations
from course.memory.resnet import resnet50
from course.models import MLP, DigitsCNN


@given(batch_size=st.integers(1, 32), model=st.sampled_from(["mlp", "cnn"]), bf16=st.booleans())
@settings(max_examples=20, deadline=None)
def test_estimate_matches_saved_tensors(batch_size, model, bf16):
    # The rule (inputs of weighted layers, outputs of ReLU, pool indices, loss log-probabilities and labels) is
    # what PyTorch's derivative formulas save; exact equality would break only if a torch release saved more.
    torch.manual_seed(0)
    net = MLP() if model == "mlp" else DigitsCNN()
    inputs, labels = torch.randn(batch_size, 1, 8, 8), torch.randint(0, 10, (batch_size,))
    if bf16:
        net, inputs = net.to(torch.bfloat16), inputs.to(torch.bfloat16)
    assert activations.estimate_bytes(net, inputs, 10) == activations.measure_bytes(net, inputs, labels)


def test_activations_grow_linearly_with_batch():
    net = DigitsCNN()
    one, eight = (activations.estimate_bytes(net, torch.randn(b, 1, 8, 8)) for b in (1, 8))
    assert eight == 8 * one


def test_resnet50_has_torchvisions_parameter_count_and_its_estimate_matches_autograd():
    net = resnet50()
    assert sum(p.numel() for p in net.parameters()) == 25_557_032  # torchvision's resnet50 model page
    inputs, labels = torch.randn(1, 3, 224, 224), torch.randint(0, 1000, (1,))
    measured = activations.measure_bytes(net, inputs, labels)
    assert activations.estimate_bytes(net, inputs, 1000) == pytest.approx(measured, rel=0.01)


def test_layers_are_listed_in_forward_order_with_shapes():
    layers = activations.layer_activations(DigitsCNN(), torch.randn(2, 1, 8, 8))
    assert layers[0].kind == "Conv2d" and layers[0].output_shape == (2, 32, 8, 8)
    assert layers[-1].kind == "Linear" and layers[-1].output_shape == (2, 10)
    assert layers[0].input_bytes == 2 * 64 * 4


def _sequential(model: str) -> nn.Sequential:
    net = DigitsCNN() if model == "cnn" else MLP()
    return nn.Sequential(*net.features, *net.classifier) if model == "cnn" else net.net


@given(model=st.sampled_from(["mlp", "cnn"]), batch_size=st.integers(1, 16), data=st.data())
@settings(max_examples=20, deadline=None)
def test_checkpointed_estimate_matches_what_checkpoint_sequential_saves(model, batch_size, data):
    torch.manual_seed(0)
    net = _sequential(model)
    segments = data.draw(st.integers(1, len(net)))
    inputs, labels = torch.randn(batch_size, 1, 8, 8), torch.randint(0, 10, (batch_size,))
    measured = activations.measure_checkpointed(net, inputs, labels, segments)
    assert activations.checkpointed_estimate(net, inputs, segments, 10) == measured


def test_two_segments_hold_less_than_no_checkpointing():
    net, inputs, labels = _sequential("cnn"), torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    assert activations.measure_checkpointed(net, inputs, labels, 2) < activations.measure_bytes(net, inputs, labels)


def test_bad_segment_count_is_refused():
    with pytest.raises(ValueError, match="segments must be between 1 and the number of layers"):
        activations.checkpointed_estimate(_sequential("mlp"), torch.randn(2, 1, 8, 8), 7)
