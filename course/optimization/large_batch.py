"""Synchronous data parallelism *is* large-batch SGD: k ranks x per-rank batch b == 1 process x global batch k*b.

Each rank takes its shard of the global batch, computes the gradient of its mean loss, and the ranks average
their gradients with ``all_reduce``. The mean of k equal-sized shard means is the mean over the whole global
batch, so every rank applies exactly the gradient one process would compute on all k*b samples, and the
parameters after the step agree to float rounding. (It holds for mean-reduced losses and models without
per-batch statistics: BatchNorm normalises per rank and breaks it.) Taught in ``notebooks/02_large_batch.ipynb``.

    results = launch(data_parallel_step, 4, model, inputs, targets, lr)   # 4 ranks, per-rank batch B/4
    single = single_process_step(model, inputs, targets, lr)            # 1 process, global batch B
    max_difference(results[0].parameters, single)                       # ~1e-8
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from course import world
from course.arguments import LossFn, check_batch, check_lr, check_model_fits_data
from course.data_parallel import rank_step, replicate, split_batch, train_step
from course.runtime import launch

Parameters = dict[str, torch.Tensor]


def parameters(model: nn.Module) -> Parameters:
    """A detached CPU copy of the model's parameters, by name."""
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters()}


def single_process_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, lr: float,
                        loss_fn: LossFn = F.cross_entropy) -> Parameters:
    """One SGD step on the whole global batch in one process; returns the new parameters (``model`` untouched).

    It is the data-parallel step (:func:`course.data_parallel.train_step`) with one replica: world size 1.

    Raises:
        ValueError: empty or mismatched batch, a model that does not fit it (sample shape, labels beyond its
            outputs), or a negative ``lr``.
    """
    return simulated_data_parallel_step(model, inputs, targets, lr, 1, loss_fn)[0]


def simulated_data_parallel_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, lr: float,
                                 world_size: int, loss_fn: LossFn = F.cross_entropy) -> list[Parameters]:
    """What ``world_size`` ranks do in one synchronous SGD step, simulated in one process.

    Every rank holds a replica, computes the gradient on its shard, receives the average of all ranks'
    gradients (what ``all_reduce(SUM) / world_size`` delivers) and applies the same SGD update: the
    data-parallel step of :func:`course.data_parallel.train_step`, with equal shards. ``model`` is untouched.

    Returns:
        The parameters of each replica after the step, in rank order (they are identical).

    Raises:
        ValueError: see :func:`course.data_parallel.split_batch` (``equal=True``) and :func:`check_lr`.
    """
    lr = check_lr(lr)
    check_batch(inputs, targets)
    split_batch(inputs, targets, world_size, equal=True)
    check_model_fits_data(model, loss_fn, inputs, targets)
    replicas = replicate(model, [next(model.parameters()).device] * world_size)
    train_step(replicas, [torch.optim.SGD(r.parameters(), lr=lr) for r in replicas], inputs, targets, loss_fn)
    return [parameters(replica) for replica in replicas]


@dataclass(frozen=True)
class StepResult:
    """What one rank saw in a data-parallel step.

    Attributes:
        rank: which rank this is.
        parameters: the rank's parameters after the step, as NumPy arrays: a tensor returned from a rank
            travels as a handle to the rank's shared memory, which is gone once the rank exits; arrays are
            copied by value.
        batch_size: b, samples in this rank's shard (per-rank batch size).
        global_batch_size: k*b, samples over all ranks.
        local_grad_norm_sq: |g|^2 of this rank's own gradient, before the all-reduce (a batch-b gradient).
        global_grad_norm_sq: |g|^2 of the all-reduced, averaged gradient (a batch-k*b gradient).
    """

    rank: int
    parameters: dict[str, np.ndarray]
    batch_size: int
    global_batch_size: int
    local_grad_norm_sq: float
    global_grad_norm_sq: float


def data_parallel_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, lr: float,
                       loss_fn: LossFn = F.cross_entropy) -> StepResult:
    """One synchronous data-parallel SGD step; a rank function for ``launch(data_parallel_step, k, ...)``.

    Every rank receives the same model and global batch, keeps only its shard (per-rank batch = global / k),
    computes its gradient, averages gradients over ranks with ``dist.all_reduce`` and steps: the data-parallel
    step of :func:`course.data_parallel.rank_step`, with plain SGD.

    Args:
        model: the same initial model on every rank (it is copied to this rank's device).
        inputs, targets: the global batch ``(B, ...)``; ``B`` divisible by the world size.
        lr: SGD learning rate.
        loss_fn: a mean-reduced loss.

    Returns:
        This rank's :class:`StepResult`.
    """
    me = world.current()
    lr = check_lr(lr)
    model = copy.deepcopy(model).to(me.device)
    stats = rank_step(model, torch.optim.SGD(model.parameters(), lr=lr), inputs, targets, loss_fn)
    arrays = {name: p.numpy() for name, p in parameters(model).items()}
    return StepResult(me.rank, arrays, len(targets) // me.world_size, len(targets), stats.local_grad_norm_sq,
                      stats.global_grad_norm_sq)


def max_difference(a: Parameters | dict[str, np.ndarray], b: Parameters | dict[str, np.ndarray]) -> float:
    """Largest absolute difference between two sets of parameters (tensors or arrays) with the same names and shapes.

    Raises:
        ValueError: the names or shapes differ.
    """
    a = {name: torch.as_tensor(value) for name, value in a.items()}
    b = {name: torch.as_tensor(value) for name, value in b.items()}
    if a.keys() != b.keys():
        raise ValueError(f"parameter names differ: {sorted(a)} vs {sorted(b)}.")
    for name in a:
        if a[name].shape != b[name].shape:
            raise ValueError(f"parameter {name!r} has shape {tuple(a[name].shape)} vs {tuple(b[name].shape)}.")
    return max((float((a[n].double() - b[n].double()).abs().max()) for n in a if a[n].numel()), default=0.0)


@dataclass(frozen=True)
class Equivalence:
    """k ranks with per-rank batch b against one process with global batch k*b, after one SGD step.

    Attributes:
        ranks: each rank's :class:`StepResult`.
        single: parameters after the single-process step.
        between_ranks: largest parameter difference between any rank and rank 0 (0 when in sync).
        vs_single: largest parameter difference between rank 0 and the single process.
        moved: largest parameter change made by the step (the scale ``vs_single`` should be tiny against).
    """

    ranks: list[StepResult]
    single: Parameters
    between_ranks: float
    vs_single: float
    moved: float


def compare_with_single_process(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, lr: float,
                                world_size: int = 4, loss_fn: LossFn = F.cross_entropy,
                                timeout_s: float = 120.0) -> Equivalence:
    """Run :func:`data_parallel_step` on ``world_size`` real ranks and :func:`single_process_step` here; compare.

    Raises:
        ValueError: bad batch, ``lr`` or ``world_size`` (checked here, before any process starts).
    """
    split_batch(inputs, targets, world_size, equal=True)
    single = single_process_step(model, inputs, targets, lr, loss_fn)
    ranks = launch.launch(data_parallel_step, world_size, model, inputs, targets, lr, loss_fn, timeout_s=timeout_s)
    first = ranks[0].parameters
    return Equivalence(
        ranks=ranks, single=single,
        between_ranks=max(max_difference(r.parameters, first) for r in ranks),
        vs_single=max_difference(first, single),
        moved=max_difference(single, parameters(model)),
    )
