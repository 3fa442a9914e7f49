"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"): the batch size at which the noise in a minibatch gradient is as large as the gradient.

G is the true (full-data) gradient and Sigma the covariance of one per-sample gradient, so a batch-B gradient
has expected squared norm ``|G|^2 + tr(Sigma) / B``. Batches far below B_simple are noise-dominated (doubling
the batch halves the steps needed); far above it, extra samples are wasted. Two ways to measure it:

* from per-sample gradients (``torch.func``: ``vmap`` over ``grad`` of a ``functional_call``), exact but
  memory-hungry: one gradient per sample;
* the unbiased two-batch estimator of the paper's appendix A.1, from the squared norms of a small-batch and a
  big-batch gradient. A data-parallel run gets both for free: each rank's gradient is a small batch, the
  all-reduced gradient is the big batch.

For linear regression with Gaussian inputs and noise both tr(Sigma) and G are known in closed form
(:func:`linear_regression_noise_scale`), which is what the tests check against. Taught in
``notebooks/02_large_batch.ipynb``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from course import exercise
from course.arguments import LossFn, check_batch, check_count, check_lr, check_model_fits_data
from course.data_parallel import StepStats, replicate, split_batch, train_step


@dataclass(frozen=True)
class NoiseScale:
    """An estimate of the two quantities behind the noise scale.

    Attributes:
        trace_sigma: tr(Sigma), the total variance of one per-sample gradient.
        grad_norm_sq: |G|^2, the squared norm of the true gradient (an unbiased estimate can come out <= 0
            when the noise swamps it).
    """

    trace_sigma: float
    grad_norm_sq: float

    @property
    def b_simple(self) -> float:
        """tr(Sigma) / |G|^2, in samples; ``inf`` when the |G|^2 estimate is not positive."""
        return self.trace_sigma / self.grad_norm_sq if self.grad_norm_sq > 0 else math.inf


def half_squared_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``0.5 * (prediction - target)^2``; the loss of :func:`linear_regression_noise_scale`."""
    return 0.5 * (prediction.reshape(target.shape) - target).pow(2).mean()


def per_sample_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                         loss_fn: LossFn = F.cross_entropy, chunk_size: int | None = None) -> torch.Tensor:
    """One flattened gradient per sample, computed in one vectorised pass with ``torch.func``.

    Args:
        model: a model without per-batch statistics (no BatchNorm in training mode).
        inputs: ``(B, ...)``; targets: ``(B, ...)``.
        loss_fn: a loss over a batch; it is called on batches of one sample.
        chunk_size: samples per vectorised chunk, to bound memory (None: all at once).

    Returns:
        ``(B, P)`` on the model's device, P = number of trainable parameters, in ``named_parameters`` order.

    Raises:
        ValueError: empty or mismatched batch, or a model that does not fit it (sample shape, labels beyond
            its outputs).
    """
    check_batch(inputs, targets)
    check_model_fits_data(model, loss_fn, inputs, targets)
    params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    frozen = {name: p.detach() for name, p in model.named_parameters() if not p.requires_grad}
    buffers = {name: b.detach() for name, b in model.named_buffers()}

    def sample_loss(trainable: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        output = functional_call(model, ({**trainable, **frozen}, buffers), (x.unsqueeze(0),))
        return loss_fn(output, y.unsqueeze(0))

    grads = vmap(grad(sample_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)(params, inputs, targets)
    return torch.cat([g.reshape(len(inputs), -1) for g in grads.values()], dim=1)


def from_per_sample(grads: torch.Tensor, whole_dataset: bool = False) -> NoiseScale:
    """tr(Sigma) and |G|^2 from per-sample gradients ``(B, P)``.

    Args:
        grads: one flattened gradient per sample.
        whole_dataset: False (default) when the B samples are a sample of a larger population: tr(Sigma) is
            the sum of the per-coordinate sample variances (divided by B - 1) and |G|^2 the squared norm of
            the mean gradient minus its expected noise tr(Sigma) / B, both unbiased. True when the B samples
            *are* the dataset that training batches are drawn from: then G is exactly their mean gradient and
            Sigma their covariance (divided by B), with nothing left to estimate.

    Raises:
        ValueError: fewer than 2 samples, or not a 2-D tensor.
    """
    if grads.dim() != 2 or len(grads) < 2:
        raise ValueError(f"need per-sample gradients of shape (B, P) with B >= 2, got {tuple(grads.shape)}.")
    grads = grads.double()
    trace_sigma = float(grads.var(dim=0, unbiased=not whole_dataset).sum())
    grad_norm_sq = float(grads.mean(dim=0).pow(2).sum())
    if not whole_dataset:
        grad_norm_sq -= trace_sigma / len(grads)
    return NoiseScale(trace_sigma, grad_norm_sq)


def two_batch_estimate(small_norm_sq: float, big_norm_sq: float, small_batch_size: int,
                       big_batch_size: int) -> NoiseScale:
    """The unbiased two-batch estimator (McCandlish et al. 2018, appendix A.1).

    Since ``E|G_B|^2 = |G|^2 + tr(Sigma) / B`` for a batch-B gradient G_B, two batch sizes give two equations:

        |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
        tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

    In data parallelism: B_small = per-rank batch size, |G_small|^2 = a rank's gradient norm squared
    (averaged over ranks for less variance); B_big = global batch size, |G_big|^2 = the all-reduced one.

    Raises:
        ValueError: batch sizes not positive integers with ``small_batch_size < big_batch_size``, or a
            negative squared norm.
    """
    b_small = check_count("small_batch_size", small_batch_size, unit="number of samples")
    b_big = check_count("big_batch_size", big_batch_size, unit="number of samples")
    if b_small >= b_big:
        raise ValueError(f"small_batch_size ({b_small}) must be smaller than big_batch_size ({b_big}); with "
                         "equal sizes the two equations are the same one.")
    if small_norm_sq < 0 or big_norm_sq < 0:
        raise ValueError(f"squared norms cannot be negative, got {small_norm_sq} and {big_norm_sq}.")
    grad_norm_sq = (b_big * big_norm_sq - b_small * small_norm_sq) / (b_big - b_small)
    trace_sigma = (small_norm_sq - big_norm_sq) / (1 / b_small - 1 / b_big)
    return NoiseScale(trace_sigma, grad_norm_sq)


def linear_regression_noise_scale(weight: torch.Tensor, true_weight: torch.Tensor, noise_std: float,
                                  input_cov: torch.Tensor | None = None) -> NoiseScale:
    """The exact tr(Sigma) and |G|^2 of linear regression, at parameters ``weight``.

    Model: x ~ N(0, S), y = x . w* + eps with eps ~ N(0, noise_std^2); per-sample loss ``0.5 (x . w - y)^2``,
    so the per-sample gradient is ``x x^T d - x eps`` with ``d = w - w*``. Gaussian moments give
    ``G = S d`` and ``Sigma = S d d^T S + (d^T S d + noise_std^2) S``, hence
    ``tr(Sigma) = |S d|^2 + (d^T S d + noise_std^2) tr(S)``. As training brings d to 0, |G|^2 falls to 0 but
    tr(Sigma) stays at ``noise_std^2 tr(S)``: the noise scale grows as the loss falls.

    Args:
        weight, true_weight: ``(D,)``.
        noise_std: standard deviation of the label noise, >= 0.
        input_cov: ``(D, D)`` covariance S of the inputs (identity when None).

    Raises:
        ValueError: mismatched shapes or a negative ``noise_std``.
    """
    if weight.shape != true_weight.shape or weight.dim() != 1:
        raise ValueError(f"weight and true_weight must both have shape (D,), got {tuple(weight.shape)} and "
                         f"{tuple(true_weight.shape)}.")
    if noise_std < 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std}.")
    dim = len(weight)
    cov = torch.eye(dim, dtype=torch.float64) if input_cov is None else input_cov.double()
    if cov.shape != (dim, dim):
        raise ValueError(f"input_cov must have shape ({dim}, {dim}), got {tuple(cov.shape)}.")
    delta = (weight - true_weight).double()
    g = cov @ delta
    return NoiseScale(float(g @ g + (delta @ g + noise_std**2) * cov.trace()), float(g @ g))


def linear_regression_data(n: int, true_weight: torch.Tensor, noise_std: float,
                           input_cov: torch.Tensor | None = None,
                           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples ``(x, y)`` of the model in :func:`linear_regression_noise_scale`: ``(n, D)`` and ``(n,)``."""
    n = check_count("n", n, unit="number of samples")
    dim = len(true_weight)
    x = torch.randn(n, dim, dtype=torch.float64, generator=generator)
    if input_cov is not None:
        x = x @ torch.linalg.cholesky(input_cov.double()).T
    noise = noise_std * torch.randn(n, dtype=torch.float64, generator=generator)
    return x, x @ true_weight.double() + noise


def from_step(stats: StepStats, world_size: int, global_batch_size: int) -> NoiseScale:
    """The two-batch estimate a data-parallel step gets for free (:func:`two_batch_estimate`): each rank's
    gradient is a small batch of ``global_batch_size / world_size`` samples, the averaged one the big batch.

    Args:
        stats: from :func:`course.data_parallel.train_step` (in one process: its local norm is already the mean
            over the replicas) or :func:`course.data_parallel.rank_step`.

    Raises:
        ValueError: ``world_size`` 1 (there is no small batch to compare with), or see :func:`two_batch_estimate`.
    """
    if check_count("world_size", world_size, unit="number of ranks") == 1:
        raise ValueError("with world_size=1 there is no small batch to compare with: use world_size >= 2.")
    return two_batch_estimate(stats.local_grad_norm_sq, stats.global_grad_norm_sq, global_batch_size // world_size,
                              global_batch_size)


@dataclass(frozen=True)
class TrackPoint:
    """One measurement during training.

    Attributes:
        step: SGD steps taken so far.
        loss: mean loss over the probe samples (the training set) at this step.
        per_sample: tr(Sigma) and |G|^2 of the training set itself at this step, from its per-sample
            gradients (``whole_dataset=True``: batches are drawn from exactly these samples).
        two_batch: the two-batch estimates of the steps since the previous point, averaged (tr(Sigma) and
            |G|^2 separately, as McCandlish et al. do, because one step's ratio is very noisy).
    """

    step: int
    loss: float
    per_sample: NoiseScale
    two_batch: NoiseScale


def track_during_training(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, global_batch_size: int,
                          lr: float, steps: int, every: int = 25, world_size: int = 4,
                          loss_fn: LossFn = F.cross_entropy, seed: int = 0) -> list[TrackPoint]:
    """Train a copy of ``model`` with simulated ``world_size``-rank SGD and measure the noise scale as it learns.

    Every step draws a global batch of ``global_batch_size`` samples (with replacement) and takes the
    data-parallel step (:func:`course.data_parallel.train_step`, plain SGD), whose gradient norms give a
    two-batch estimate (:func:`from_step`); every ``every`` steps the per-sample estimate is measured on all of
    ``inputs``, next to the average of the two-batch estimates of the steps in between.

    Args:
        inputs, targets: the training set ``(N, ...)``; also the probe for the per-sample estimate.
        global_batch_size: samples per step over all ranks, divisible by ``world_size`` and at most N.
        steps: number of SGD steps.
        world_size: simulated ranks, at least 2.

    Returns:
        One :class:`TrackPoint` after every ``every`` steps.

    Raises:
        ValueError: bad batch, ``global_batch_size`` 0, larger than the data or not divisible by ``world_size``,
            ``world_size`` below 2, negative ``lr``, or ``every`` not in 1..steps.
    """
    n = check_batch(inputs, targets)
    lr = check_lr(lr)
    global_batch_size = check_count("global_batch_size", global_batch_size, unit="number of samples", maximum=n)
    split_batch(inputs[:global_batch_size], targets[:global_batch_size], world_size, equal=True)
    check_model_fits_data(model, loss_fn, inputs, targets)
    if not 1 <= every <= steps:
        raise ValueError(f"every must be in 1..steps={steps}, got {every}.")
    replicas = replicate(model, [inputs.device] * world_size)
    optimizers = [torch.optim.SGD(replica.parameters(), lr=lr) for replica in replicas]
    generator = torch.Generator().manual_seed(seed)
    points: list[TrackPoint] = []
    window: list[NoiseScale] = []
    for step in range(1, steps + 1):
        batch = torch.randint(n, (global_batch_size,), generator=generator).to(inputs.device)
        stats = train_step(replicas, optimizers, inputs[batch], targets[batch], loss_fn)
        window.append(from_step(stats, world_size, global_batch_size))
        if step % every == 0:
            with torch.no_grad():
                loss = float(loss_fn(replicas[0](inputs), targets))
            per_sample = from_per_sample(per_sample_gradients(replicas[0], inputs, targets, loss_fn),
                                         whole_dataset=True)
            two_batch = NoiseScale(sum(e.trace_sigma for e in window) / len(window),
                                   sum(e.grad_norm_sq for e in window) / len(window))
            points.append(TrackPoint(step, loss, per_sample, two_batch))
            window = []
    return points


@exercise.checker
def check_two_batch_exercise(fn: Callable[[float, float, int, int], tuple[float, float]]) -> bool:
    """Exercise checker: does the student's ``fn(small_norm_sq, big_norm_sq, small_batch_size, big_batch_size) ->
    (trace_sigma, grad_norm_sq)`` agree with :func:`two_batch_estimate`? Prints feedback on the first case that
    differs (a stub or an error gets :func:`course.exercise.checker`'s feedback); returns True if all agree."""
    cases = [(small, big, b_small, b_big) for small, big in ((2.0, 1.0), (0.5, 0.45), (10.0, 0.1), (1.0, 1.0))
             for b_small, b_big in ((8, 32), (1, 2), (64, 1024))]
    for small, big, b_small, b_big in cases:
        expected = two_batch_estimate(small, big, b_small, b_big)
        call = f"fn({small}, {big}, {b_small}, {b_big})"
        got = fn(small, big, b_small, b_big)
        try:
            trace_sigma, grad_norm_sq = got
        except (TypeError, ValueError):
            raise AssertionError(f"{call} returned {got!r}: it must return the pair (trace_sigma, grad_norm_sq)."
                                 ) from None
        for name, value, want in (("trace_sigma", trace_sigma, expected.trace_sigma),
                                  ("grad_norm_sq", grad_norm_sq, expected.grad_norm_sq)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise AssertionError(f"{call}: {name} = {value!r} is not a number.") from None
            if not math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12):
                raise AssertionError(f"{call}: {name} = {value!r}, expected {want!r}. Hint: solve E|G_B|^2 = |G|^2 "
                                     "+ tr(Sigma)/B for the two unknowns, using B = small_batch_size and B = "
                                     "big_batch_size.")
    print(f"Correct on all {len(cases)} cases.")
    return True
