"""grader.replay: the single-process union-batch gradient equals the average of per-rank gradients."""

import pytest
import torch

from course import data, models
from grader import replay
from grader.inrank import fingerprints

pytestmark = pytest.mark.unit6


def flat_parameters(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_union_batch_gradient_is_the_average_of_the_ranks_gradients():
    torch.manual_seed(0)
    model = models.DigitsCNN(width=8)
    train = data.load().train
    images, labels = train.tensors
    shards = [list(range(r, 64, 4)) for r in range(4)]  # 4 ranks x 16 samples
    per_rank = []
    for idx in shards:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(images[idx]), labels[idx]).backward()
        per_rank.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    shapes = [list(p.shape) for p in model.parameters()]
    union = replay.union_batch_gradient(flat_parameters(model), shapes, shards, train)
    torch.testing.assert_close(union, torch.stack(per_rank).mean(0), rtol=1e-5, atol=1e-6)


def test_compare_reports_the_scale_of_summed_gradients():
    g = torch.randn(1000)
    summed = replay.compare(1, 4 * g, g)
    assert summed.scale == pytest.approx(4.0) and summed.relative_error == pytest.approx(3.0)
    assert replay.compare(1, g, g).relative_error == 0.0


def test_parameters_of_another_model_are_refused():
    shapes = [list(p.shape) for p in models.MLP().parameters()]
    with pytest.raises(ValueError, match="DigitsCNN"):
        replay.model_from_flat(torch.zeros(10), shapes)


def test_encode_decode_round_trip():
    tensors = [torch.randn(3, 4), torch.randn(5)]
    torch.testing.assert_close(fingerprints.decode(fingerprints.encode(tensors)),
                               torch.cat([t.reshape(-1) for t in tensors]))


def test_a_transformation_the_same_on_every_step_is_named_by_what_it_keeps():
    """Clipping keeps one norm, a constant factor keeps one scale; both keep the direction, which nothing else does."""
    g1, g2 = torch.randn(1000, generator=torch.Generator().manual_seed(1)), torch.randn(1000)
    shortened = replay.compare(1, g1 / g1.norm(), g1)
    assert shortened.direction_error < 1e-6 and shortened.norm == pytest.approx(1.0)  # float32 rounding
    clipped = [replay.compare(1, g1 / g1.norm(), g1), replay.compare(2, g2 / g2.norm(), g2)]
    assert replay.transformation(clipped, 1e-3) == replay.Transformation("clipped", pytest.approx(1.0))
    halved = [replay.compare(1, 0.5 * g1, g1), replay.compare(2, 0.5 * g2, g2)]
    assert replay.transformation(halved, 1e-3) == replay.Transformation("scaled", pytest.approx(0.5))
    elsewhere = [replay.compare(1, g1 + g2, g1)]
    assert replay.transformation(elsewhere, 1e-3) is None
    exact = [replay.compare(1, g1, g1)]  # nothing off: nothing to name
    assert replay.transformation(exact, 1e-3) is None
