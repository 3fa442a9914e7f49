"""course.optimization.lars: the trust ratio and a LARS step against a hand computation; without the ratio it is SGD."""

import math

import pytest
import torch
from torch import nn

from course.optimization import lars


@pytest.mark.parametrize("call, message", [
    (lambda: lars.LARS([nn.Parameter(torch.ones(1))], lr=-1.0), "lr must be"),
    (lambda: lars.LARS([nn.Parameter(torch.ones(1))], lr=1.0, momentum=1.5), "momentum"),
    (lambda: lars.LARS([nn.Parameter(torch.ones(1))], lr=1.0, trust_coefficient=0.0), "trust_coefficient"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_lars_step_matches_a_hand_computation_of_the_trust_ratio():
    w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))  # |w| = 5
    optimizer = lars.LARS([w], lr=2.0, momentum=0.9, weight_decay=0.1, trust_coefficient=0.01, eps=0.0)
    w.grad = torch.tensor([0.6, 0.8], dtype=torch.float64)  # |g| = 1
    optimizer.step()
    # trust = 0.01 * 5 / (1 + 0.1 * 5) = 1/30; d = g + 0.1 w = (0.9, 1.2); v = 2 * (1/30) * d = (0.06, 0.08)
    assert w.detach().tolist() == pytest.approx([2.94, 3.92], rel=1e-12)
    w.grad = torch.tensor([0.0, 1.0], dtype=torch.float64)
    optimizer.step()
    norm = math.hypot(2.94, 3.92)  # 4.9
    trust = 0.01 * norm / (1.0 + 0.1 * norm)
    velocity = [0.9 * 0.06 + 2 * trust * (0.1 * 2.94), 0.9 * 0.08 + 2 * trust * (1.0 + 0.1 * 3.92)]
    assert w.detach().tolist() == pytest.approx([2.94 - velocity[0], 3.92 - velocity[1]], rel=1e-12)


def test_trust_ratio_is_one_when_a_norm_is_zero():
    assert lars.trust_ratio(0.0, 1.0, 0.001, 0.0) == 1.0 and lars.trust_ratio(1.0, 0.0, 0.001, 0.0) == 1.0
    assert lars.trust_ratio(5.0, 1.0, 0.01, 0.1, eps=0.0) == pytest.approx(1 / 30)


def test_lars_without_trust_ratio_is_torch_sgd_with_momentum():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ours = lars.LARS(a.parameters(), lr=0.3, momentum=0.9, trust_coefficient=None)
    reference = torch.optim.SGD(b.parameters(), lr=0.3, momentum=0.9)
    x = torch.randn(8, 4)
    for _ in range(5):
        for model, optimizer in ((a, ours), (b, reference)):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters(), strict=True))
