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
