"""course.numerics.adam and the zero/fsdp labs' bound (grader.labs.zero.bounds), in one process: ZeRO-1 against
DDP + torch.optim.Adam, on 2-6 simulated ranks whose gradients are added in shuffled orders. Correct code stays
within the derived bound at every step, mistakes go beyond it, and the bound is never more than 10x the largest
error correct code shows (measured here, step by step)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.numerics import bounds
from course.numerics.adam import Drift
from grader.labs.fsdp import check as fsdp
from grader.labs.zero import check as zero
from grader.labs.zero.bounds import trajectory_bounds

pytestmark = pytest.mark.unit7
#: the labs' models: zero's MLP, zero's uneven model (tanh, squared error), one of fsdp's variants
MODELS = {"zero": lambda: zero._model(0), "uneven": lambda: zero._uneven_model(0),
          "fsdp": lambda: fsdp._model({"seed": 0, "hidden": 40, "layers": 5})}


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _local(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, world_size: int) -> list:
    """Each simulated rank's own gradient (flat), from its slice of the global batch."""
    rows, found = images.shape[0] // world_size, []
    for rank in range(world_size):
        model.zero_grad(set_to_none=True)
        zero._loss(model, images[rank * rows:(rank + 1) * rows], labels[rank * rows:(rank + 1) * rows]).backward()
        found.append(_flat(p.grad for p in model.parameters()))
    return found


def _ddp_adam_step(model, optimizer, batch, world_size: int, order: list[int]) -> None:
    """DDP + torch.optim.Adam: each rank's gradient divided by world_size, then added in ``order``."""
    grads = _local(model, *batch, world_size)
    average = grads[order[0]] / world_size
    for rank in order[1:]:
        average = average + grads[rank] / world_size
    offset = 0
    for p in model.parameters():
        p.grad = average[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()


def _zero_step(model, state: dict, batch, world_size: int, order: list[int], mistake: str) -> None:
    """ZeRO-1 as grader/labs/zero/reference.py computes it: the sum in ``order``, then divided, then its Adam."""
    grads = _local(model, *batch, world_size)
    grad = grads[order[0]].clone()
    for rank in order[1:]:
        grad += grads[rank]
    if mistake != "sums":
        grad /= world_size
    state["t"] += 1
    (beta1, beta2), t, eps = zero.BETAS, state["t"], zero.EPS
    state["m"].mul_(beta1).add_(grad, alpha=1 - beta1)
    state["v"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    second = 1.0 if mistake == "no_bias_correction" else 1 - beta2 ** t
    denominator = (state["v"] / second + (eps * eps if mistake == "eps_inside" else 0)).sqrt_()
    denominator = denominator if mistake == "eps_inside" else denominator.add_(eps)
    params = _flat(model.parameters()) - zero.LR * (state["m"] / (1 - beta1 ** t)) / denominator
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(params[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def _verdicts(name: str, world_size: int, steps: int, seed: int, mistake: str = "") -> list[bounds.Verdict]:
    """Both runs on the same batches, the reductions in shuffled orders; one verdict per step."""
    make, shuffle = MODELS[name], random.Random(seed)
    reference, student = make(), make()
    optimizer = torch.optim.Adam(reference.parameters(), lr=zero.LR, betas=zero.BETAS, eps=zero.EPS)
    state = {"t": 0, "m": torch.zeros_like(_flat(student.parameters()))}
    state["v"] = torch.zeros_like(state["m"])
    ours, theirs, batches = [_flat(student.parameters())], [_flat(reference.parameters())], []
    for step in range(steps):
        batches.append(zero.global_batch(step, seed, world_size))
        orders = [shuffle.sample(range(world_size), world_size) for _ in range(2)]
        _ddp_adam_step(reference, optimizer, batches[-1], world_size, orders[0])
        _zero_step(student, state, batches[-1], world_size, orders[1], mistake)
        ours.append(_flat(student.parameters()))
        theirs.append(_flat(reference.parameters()))
    limits = trajectory_bounds(make(), theirs, batches, world_size, zero.ADAM, zero.CLASSES)
    return [bounds.verdict(o, r, limit) for o, r, limit in zip(ours[1:], theirs[1:], limits[1:], strict=True)]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(MODELS)), st.integers(2, 6), st.integers(0, 10**6))
def test_zero1_in_any_reduction_order_stays_within_the_bound_and_a_sum_goes_beyond(name, world_size, seed):
    correct = _verdicts(name, world_size, 3, seed)
    assert all(v.within for v in correct), [str(v) for v in correct]
    assert not _verdicts(name, world_size, 1, seed, "sums")[0].within


@pytest.mark.parametrize("mistake", ["no_bias_correction", "eps_inside"])
def test_adams_own_mistakes_go_beyond_the_bound_at_their_first_step(mistake):
    first = 1 if mistake == "no_bias_correction" else 0  # with t = 1, sqrt(v / (1 - b2)) is already right
    assert not _verdicts("zero", 4, 2, 0, mistake)[first].within


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_bound_is_never_more_than_10x_the_largest_error_correct_code_shows(name):
    # steps 1-3: the published runs' (zero: 3 steps, fsdp: 2-3). The bound grows by a worst case each step; at a
    # 4th step (zero's 4-step variant) correct code came within 12x of it (course/numerics/adam.py says why)
    closest = [0.0] * 3  # per step: the largest seen / bound over world sizes 2-6
    for world_size in range(2, 7):
        for step, judged in enumerate(_verdicts(name, world_size, 3, world_size)):
            closest[step] = max(closest[step], judged.ratio)
    assert all(0.1 <= ratio <= 1 for ratio in closest), closest


def test_adam_amplifies_a_small_gradients_difference_up_to_lr_over_eps():
    drift = Drift(lr=1e-2, betas=(0.9, 0.999), eps=1e-3, dtype=torch.float64)  # float64: rounding negligible
    gradient, bound = torch.tensor([0.0, 1e-3, 1.0], dtype=torch.float64), torch.full((3,), 1e-9, dtype=torch.float64)
    drift.step(gradient, bound, torch.zeros(3, dtype=torch.float64))
    # step 1 is lr g / (|g| + eps): its slope is lr eps / (|g| + eps)^2, 10 at g = 0, 2.5 at g = eps, ~1e-5 at 1
    slopes = (drift.updates[0] / 1e-9).tolist()
    assert slopes[:2] == pytest.approx([10, 2.5], rel=1e-7, abs=0)  # plus float64 rounding terms
    assert slopes[2] == pytest.approx(1e-2 * 1e-3 / 1.001**2, rel=1e-2, abs=0)  # plus rounding terms: ~2e-17
    with pytest.raises(ValueError, match="expected the gradient, its bound and the parameters in one shape"):
        drift.step(gradient, bound, torch.zeros(2))
