"""course.optimization.large_batch: k ranks x per-rank batch b give the parameters of 1 process x global batch k*b."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course import models
from course.optimization import large_batch as lb


def batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=generator), torch.randint(10, (n,), generator=generator)


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return models.MLP(hidden=(16,))


def test_mismatched_shapes_and_negative_lr_are_rejected():
    x, y = batch(8)
    with pytest.raises(ValueError, match="inputs hold 8 samples but targets hold 7"):
        lb.single_process_step(model(), x, y[:7], lr=0.1)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        lb.single_process_step(model(), x, y, lr=-0.1)


def test_step_matches_manual_sgd_and_leaves_the_model_untouched():
    net, (x, y) = model(), batch(8)
    before = lb.parameters(net)
    after = lb.single_process_step(net, x, y, lr=0.5)
    net.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    expected = {name: p.detach() - 0.5 * p.grad for name, p in net.named_parameters()}
    assert lb.max_difference(after, expected) < 1e-7
    assert lb.max_difference(lb.parameters(net), before) == 0.0
    assert lb.max_difference(after, before) > 1e-4  # the step really moved the parameters


@settings(max_examples=15, deadline=None)
@given(world_size=st.sampled_from([1, 2, 3, 4, 8]), per_rank=st.integers(1, 6), seed=st.integers(0, 100),
       lr=st.floats(0.0, 2.0))
def test_simulated_data_parallel_step_equals_the_global_batch_step(world_size, per_rank, seed, lr):
    net, (x, y) = model(seed), batch(world_size * per_rank, seed)
    replicas = lb.simulated_data_parallel_step(net, x, y, lr, world_size)
    single = lb.single_process_step(net, x, y, lr)
    assert all(lb.max_difference(r, replicas[0]) == 0.0 for r in replicas)  # ranks stay in sync
    assert lb.max_difference(replicas[0], single) < 1e-6


def test_unequal_weighting_would_break_the_equivalence():
    # Guard that the test above can fail: averaging each shard's *sum* instead of its mean is not the same step.
    # Each of the 2 shards holds 4 samples, so the averaged shard sums are 4 x the global mean gradient: the
    # wrong step is the single-process step at 4 x the rate, and not the step at the rate asked for.
    net, (x, y) = model(), batch(8)
    summed = lambda out, target: nn.functional.cross_entropy(out, target, reduction="sum")
    wrong = lb.simulated_data_parallel_step(net, x, y, 0.5, 2, loss_fn=summed)[0]
    assert lb.max_difference(wrong, lb.single_process_step(net, x, y, 0.5)) > 1e-3
    assert lb.max_difference(wrong, lb.single_process_step(net, x, y, 0.5 * 4)) < 1e-6


def test_max_difference_rejects_different_models():
    with pytest.raises(ValueError, match="parameter names differ"):
        lb.max_difference(lb.parameters(model()), lb.parameters(models.LinearModel()))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_four_real_ranks_with_all_reduce_match_one_process():
    net, (x, y) = model(), batch(32)
    result = lb.compare_with_single_process(net, x, y, lr=0.5, world_size=4, timeout_s=150)
    assert [r.rank for r in result.ranks] == [0, 1, 2, 3]
    assert all(r.batch_size == 8 and r.global_batch_size == 32 for r in result.ranks)
    assert result.between_ranks == 0.0
    assert result.vs_single < 1e-6 < result.moved
    assert lb.max_difference(result.ranks[0].parameters, lb.simulated_data_parallel_step(net, x, y, 0.5, 4)[0]) < 1e-6
    # The all-reduced gradient is the global-batch gradient; each rank's own one is noisier (bigger norm, on average).
    big = sum(g.double().pow(2).sum() for g in torch.autograd.grad(nn.functional.cross_entropy(net(x), y),
                                                                   list(net.parameters())))
    assert result.ranks[0].global_grad_norm_sq == pytest.approx(float(big), rel=1e-5)
    assert sum(r.local_grad_norm_sq for r in result.ranks) / 4 > result.ranks[0].global_grad_norm_sq


def test_compare_checks_input_before_starting_processes():
    x, y = batch(10)
    with pytest.raises(ValueError, match="does not split evenly over 4 ranks"):
        lb.compare_with_single_process(model(), x, y, lr=0.1, world_size=4)


def test_a_model_that_does_not_fit_the_batch_is_refused_with_the_fix():
    x, y = batch(8)
    with pytest.raises(ValueError, match=r"one sample has shape \(1, 7, 7\).*input_shape=\(1, 7, 7\)"):
        lb.single_process_step(model(), x[:, :, :7, :7], y, lr=0.1)
    with pytest.raises(ValueError, match=r"labels must be in 0..9"):
        lb.simulated_data_parallel_step(model(), x, y + 10, lr=0.1, world_size=2)
