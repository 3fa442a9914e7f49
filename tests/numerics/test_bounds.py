"""course.numerics.bounds and propagate: correct split computations, in every dtype, on 2-6 simulated ranks and
in shuffled reduction orders, stay within the derived bound; planted mistakes go beyond it; and the bound is never
more than 10x the largest error correct code shows (measured here)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F  # noqa: N812

from course.numerics import bounds
from grader.labs.tp_mlp.bounds import comparison_bounds

pytestmark = pytest.mark.unit8
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def test_unit_roundoff_and_gamma_follow_higham():
    assert bounds.unit_roundoff(torch.float32) == 2.0**-24 and bounds.unit_roundoff(torch.bfloat16) == 2.0**-8
    assert bounds.gamma(3, torch.float16) == pytest.approx(3 * 2.0**-11 / (1 - 3 * 2.0**-11))
    assert bounds.gamma_probable(64, torch.float32) < bounds.gamma(64, torch.float32)
    with pytest.raises(ValueError, match="can lose every digit"):
        bounds.gamma(256, torch.bfloat16)
    with pytest.raises(ValueError, match="expected a floating-point dtype"):
        bounds.unit_roundoff(torch.int64)


def test_a_verdict_says_bug_or_rounding_with_both_numbers():
    within = bounds.verdict(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]), 1e-6)
    assert within.within and str(within).startswith("within rounding (bound 1e-06, seen ")
    bug = bounds.verdict(torch.tensor([1.0, 2.334]), torch.tensor([1.0, 2.0]), torch.tensor([1e-6, 2e-6]))
    assert not bug.within and bug.index == (1,) and str(bug) == "beyond rounding: a bug (bound 2e-06, seen 0.334)"
    assert not bounds.verdict(torch.tensor([float("nan")]), torch.tensor([0.0]), 1.0).within
    with pytest.raises(ValueError, match=r"expected a tensor of shape \(2,\), got \(3,\)"):
        bounds.verdict(torch.zeros(3), torch.zeros(2), 1.0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(DTYPES), st.integers(2, 6), st.integers(0, 10**6))
def test_a_reduction_of_partial_sums_in_any_order_stays_within_its_bound(dtype, world_size, seed):
    generator = torch.Generator().manual_seed(seed)
    partials = (torch.randn(world_size, 256, generator=generator) * 10).to(dtype)  # one partial sum per rank
    order = list(range(world_size))
    random.Random(seed).shuffle(order)
    total = partials[order[0]].clone()
    for rank in order[1:]:
        total += partials[rank]  # rounded to dtype at every addition, as gloo does
    exact = partials.double().sum(0)
    bound = bounds.reduction_bound(partials.double().abs().sum(0), world_size, dtype)
    assert bounds.verdict(total, exact, bound).within


def _split_mlp(tensors: list[torch.Tensor], world_size: int, order: list[int], bias_on_every_rank: bool = False
               ) -> dict[str, torch.Tensor]:
    """The tensor-parallel MLP on simulated ranks, its partial sums added in ``order``: output and x's gradient."""
    w1, b1, w2, b2, x, upstream = tensors
    k = w1.shape[0] // world_size
    outputs, inputs = [], []
    for rank in range(world_size):
        rows = slice(rank * k, (rank + 1) * k)
        mine = x.clone().requires_grad_()
        out = F.linear(F.gelu(F.linear(mine, w1[rows], b1[rows])), w2[:, rows], b2 if bias_on_every_rank else None)
        out.backward(upstream)
        outputs.append(out.detach())
        inputs.append(mine.grad)
    y, grad = outputs[order[0]].clone(), inputs[order[0]].clone()
    for rank in order[1:]:
        y, grad = y + outputs[rank], grad + inputs[rank]
    return {"y": y if bias_on_every_rank else y + b2, "x": grad}


def _unsplit_mlp(tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    w1, b1, w2, b2, x, upstream = tensors
    x = x.clone().requires_grad_()
    y = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    y.backward(upstream)
    return {"y": y.detach(), "x": x.grad}


def _problem(seed: int, world_size: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(16, 16 * world_size), torch.nn.Linear(16 * world_size, 16)
    return [fc1.weight.detach(), fc1.bias.detach(), fc2.weight.detach(), fc2.bias.detach(), torch.randn(2, 4, 16),
            torch.randn(2, 4, 16)]


def _tp_mlp_case(dtype: torch.dtype, world_size: int, seed: int) -> tuple[dict, dict]:
    """Verdicts of the correct split MLP and of one with fc2's bias added on every rank, for one case."""
    tensors = _problem(seed, world_size)
    low = [t.to(dtype) for t in tensors]
    order = list(range(world_size))
    random.Random(seed).shuffle(order)
    limits = comparison_bounds(tuple(tensors), dtype, world_size)
    truth, good, bad = _unsplit_mlp(low), _split_mlp(low, world_size, order), _split_mlp(low, world_size, order, True)
    return ({name: bounds.verdict(good[name], truth[name], limits[name]) for name in truth},
            {"y": bounds.verdict(bad["y"], truth["y"], limits["y"])})


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.sampled_from(DTYPES), st.integers(2, 6), st.integers(0, 10**6))
def test_the_split_mlp_is_within_its_bound_and_the_bias_on_every_rank_beyond(dtype, world_size, seed):
    correct, mistaken = _tp_mlp_case(dtype, world_size, seed)
    assert all(v.within for v in correct.values()), correct
    assert not mistaken["y"].within, mistaken


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_bound_is_never_more_than_10x_the_largest_error_correct_code_shows(dtype):
    closest = {"y": 0.0, "x": 0.0}  # the largest seen / bound over the cases, per tensor
    for world_size in range(2, 7):
        for seed in range(4):
            for name, judged in _tp_mlp_case(dtype, world_size, seed)[0].items():
                closest[name] = max(closest[name], judged.ratio)
    assert all(0.1 <= ratio <= 1 for ratio in closest.values()), closest
