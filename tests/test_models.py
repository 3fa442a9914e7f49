"""course.models: shapes on every dataset's images, and counts checked against hand-computed closed forms."""

import pytest
import torch

from course import models

pytestmark = pytest.mark.unit0


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
@pytest.mark.parametrize("name", ["linear", "mlp", "cnn"])
def test_every_model_maps_a_batch_of_images_to_logits(name, shape):
    model = models.build(name, shape, num_classes=7)
    assert model(torch.zeros(5, *shape)).shape == (5, 7)


def test_parameter_count_and_gradient_bytes_match_hand_counts():
    linear = models.LinearModel((1, 8, 8), 10)
    assert models.parameter_count(linear) == 64 * 10 + 10
    assert models.gradient_bytes(linear) == 4 * (64 * 10 + 10)
    assert models.gradient_bytes(linear.double()) == 8 * (64 * 10 + 10)
    mlp = models.MLP((1, 8, 8), 10, hidden=(16,))
    for p in mlp.net[1].parameters():
        p.requires_grad_(False)
    assert models.parameter_count(mlp) == 16 * 10 + 10
    assert models.parameter_count(mlp, trainable_only=False) == 64 * 16 + 16 + 16 * 10 + 10


def test_flops_per_sample_is_twice_the_multiply_adds():
    assert models.flops_per_sample(models.LinearModel((1, 8, 8), 10), (1, 8, 8)) == 2 * 64 * 10
    assert models.flops_per_sample(models.MLP((1, 8, 8), 10, hidden=(16, 8)), (1, 8, 8)) == 2 * (
        64 * 16 + 16 * 8 + 8 * 10)
    w = 32
    conv = 2 * (w * 8 * 8 * 1 * 9 + 2 * w * 8 * 8 * w * 9 + 2 * w * 4 * 4 * 2 * w * 9)
    dense = 2 * (8 * w * 128 + 128 * 10)
    assert models.flops_per_sample(models.DigitsCNN(1, 10, width=w), (1, 8, 8)) == conv + dense


def test_flops_counting_leaves_no_hooks_behind():
    cnn = models.DigitsCNN()
    models.flops_per_sample(cnn, (1, 8, 8))
    assert all(not m._forward_hooks for m in cnn.modules())


def test_unknown_model_lists_the_choices():
    with pytest.raises(ValueError, match="choose 'linear', 'mlp' or 'cnn'"):
        models.build("resnet")
