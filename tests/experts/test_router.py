"""course.experts.router: top-k gates, capacity in order of choice, and Switch's balancing loss against closed
forms (hypothesis over the shapes)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.experts import router


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 8), st.integers(0, 10_000), st.data())
def test_top_k_picks_the_most_probable_experts_and_gates_sum_to_one(tokens, experts, seed, data):
    k = data.draw(st.integers(1, experts))
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed))
    gates, chosen, probs = router.route(logits, k)
    assert torch.equal(probs.gather(1, chosen), probs.sort(-1, descending=True).values[:, :k])
    expected = torch.ones(tokens) if k > 1 else probs.max(-1).values
    assert torch.allclose(gates.sum(-1), expected)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 8), st.integers(1, 3), st.floats(0.25, 2.0), st.integers(0, 10_000))
def test_capacity_keeps_the_first_limit_assignments_of_each_expert_first_choices_first(tokens, experts, k, factor,
                                                                                       seed):
    k = min(k, experts)
    chosen = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(seed + t))[:k]
                          for t in range(tokens)])
    limit = router.capacity(tokens, experts, k, factor)
    kept, _ = router.keep(chosen, experts, limit)
    seen = [0] * experts
    for choice in range(k):  # the rule, written out: first choices in token order, then second choices, ...
        for token in range(tokens):
            expert = int(chosen[token, choice])
            assert bool(kept[token, choice]) == (seen[expert] < limit)
            seen[expert] += 1
    assert limit == math.ceil(factor * tokens * k / experts)


def test_the_balancing_loss_is_one_when_uniform_and_more_when_skewed():
    experts = 4
    uniform = router.load_balancing_loss(torch.full((8, experts), 0.25), torch.arange(8)[:, None] % experts)
    assert float(uniform) == pytest.approx(1.0)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]]).repeat(8, 1)
    assert float(router.load_balancing_loss(skewed, torch.zeros(8, 1, dtype=torch.long))) == pytest.approx(2.8)


def test_k_outside_the_experts_is_refused():
    with pytest.raises(ValueError, match="use 1 <= k <= experts"):
        router.route(torch.zeros(3, 4), 5)
