"""course.experts.moe: the one-process layer equals its definition written out token by token, drops what capacity
refuses, and computes k experts per token."""

import torch

from course.experts import moe


def _by_hand(layer: moe.MoELayer, x: torch.Tensor) -> torch.Tensor:
    routing = layer.route(x)
    rows = []
    for t in range(x.shape[0]):
        row = torch.zeros(x.shape[1])
        for c in range(layer.config.k):
            if routing.kept[t, c]:
                row += routing.gates[t, c] * layer.experts[int(routing.experts[t, c])](x[t])
        rows.append(row)
    return torch.stack(rows)


def test_the_layer_equals_its_definition_with_and_without_drops():
    for factor in (0.5, 1.0, 4.0):
        layer = moe.build(moe.Config(capacity_factor=factor))
        x = torch.randn(12, 16, generator=torch.Generator().manual_seed(1))
        y = layer(x)
        assert torch.allclose(y, _by_hand(layer, x), atol=1e-6)
        assert (layer.routing.dropped > 0) == (factor < 1.0) or factor == 1.0


def test_a_token_whose_every_assignment_is_dropped_gets_zero():
    layer = moe.build(moe.Config(capacity_factor=0.25))
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(2))
    y = layer(x)
    gone = ~layer.routing.kept.any(-1)
    assert gone.any() and torch.equal(y[gone], torch.zeros_like(y[gone]))
