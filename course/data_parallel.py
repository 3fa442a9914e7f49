"""Data parallelism by hand: replicate the model, split the batch, average the gradients, step.

What people write before they know DDP (d2l.ai 13.5, "Training on Multiple GPUs" from scratch). Five named
steps, each a small function:

    shards = split_batch(images, labels, len(replicas))      # one shard per replica
    for replica, (x, y) in zip(replicas, shards): backward    # each replica: its shard's gradient
    average_gradients(replicas, shard_sizes)                  # the "allreduce", by hand, in one process
    for optimizer in optimizers: optimizer.step()             # identical updates keep replicas identical

:func:`train_step` composes them; it equals one process training on the whole batch (to float rounding),
which is notebook 02's "k ranks x batch b == one process with batch k*b". On ranks, :func:`rank_step` is the same
step, its average :func:`allreduce_gradients` with ``dist.all_reduce``. These two are the course's data-parallel
step: notebook 02's equivalence and noise scale stand on them too. Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from course import train
from course.arguments import LossFn, check_count
from course.timing import PhaseClock


def split_batch(inputs: torch.Tensor, targets: torch.Tensor | None, world_size: int, *, equal: bool = False
                ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Split a global batch into ``world_size`` contiguous shards, one per rank (or replica), in rank order.

    The one split of the course: notebook 02's ranks, this module's replicas, the parameter server's workers, the
    pipeline's micro-batches and ``torch.nn.DataParallel``'s scatter (:mod:`course.naive.naive_data_parallel`) all cut
    their batch here.

    Args:
        inputs: ``(B, ...)``, the global batch. targets: ``(B, ...)``, same ``B``; or None to split the inputs
            alone (DataParallel computes the loss on one device, against all the targets).
        world_size: number of shards, 1 <= world_size <= B.
        equal: require equal shards of ``B / world_size`` samples (per-rank batch size). Ranks that average
            their gradients with equal weights (``all_reduce``, then divide by the world size) need it: unequal
            shards would weight samples unequally. Without it the shards' sizes differ by at most one.

    Returns:
        ``[(inputs_0, targets_0), ...]``, views into the batch; the first ``B % world_size`` shards are one sample
        larger (none without a remainder). Shard ``r`` is rank ``r``'s.

    Raises:
        ValueError: mismatched batch dimensions, a ``world_size`` that is not a positive integer, fewer samples
            than shards (one would get nothing), or with ``equal`` a ``B`` not divisible by ``world_size``.
    """
    world_size = check_count("world_size", world_size, unit="number of ranks")
    if inputs.ndim == 0 or (targets is not None and (targets.ndim == 0 or len(inputs) != len(targets))):
        got = "None" if targets is None else tuple(targets.shape)
        raise ValueError(f"inputs and targets need the same batch dimension, got shapes {tuple(inputs.shape)} "
                         f"and {got}.")
    batch = len(inputs)
    if batch < world_size:
        raise ValueError(f"a batch of {batch} samples cannot feed {world_size} ranks or replicas: each needs at least "
                         f"one sample. Use a global batch size of at least {world_size}, or fewer ranks.")
    if equal and batch % world_size:
        raise ValueError(
            f"a global batch of {batch} samples does not split evenly over {world_size} ranks; use a global "
            f"batch size divisible by {world_size}, e.g. {batch - batch % world_size}."
        )
    shards = torch.tensor_split(inputs, world_size)
    return list(zip(shards, [None] * world_size if targets is None else torch.tensor_split(targets, world_size),
                    strict=True))


def replicate(model: nn.Module, devices: Sequence[torch.device | str], *, differentiable: bool = False
              ) -> list[nn.Module]:
    """One copy of ``model`` on each device, with the same parameters everywhere.

    Args:
        devices: one per copy, e.g. :func:`replica_devices`.
        differentiable: False (default): independent copies, each trained by an optimizer of its own; identical
            updates keep them identical (d2l's by-hand data parallelism, :func:`train_step`). True: each copy's
            parameters and buffers are made from ``model``'s inside autograd (``to`` onto another device,
            ``clone`` onto the same one), so a backward through a copy sums its gradient into ``model``'s own
            parameters, as ``torch.nn.DataParallel``'s ``Broadcast`` does every forward
            (:mod:`course.naive.naive_data_parallel`). Such copies are for one forward: replicate again after a step.

    Raises:
        ValueError: no devices.
    """
    if len(devices) == 0:
        raise ValueError("replicate() needs at least one device, got none.")
    if not differentiable:
        return [copy.deepcopy(model).to(device) for device in devices]
    return [_differentiable_copy(model, torch.device(device)) for device in devices]


def _differentiable_copy(model: nn.Module, device: torch.device) -> nn.Module:
    replica = copy.deepcopy(model)  # the structure; every tensor in it is replaced below
    for name, module in replica.named_modules():
        source = model.get_submodule(name)
        for key, tensor in source._parameters.items():
            if tensor is not None:  # a copy made by autograd is no leaf, so no Parameter: a plain attribute
                del module._parameters[key]
                setattr(module, key, tensor.to(device) if tensor.device != device else tensor.clone())
        for key, tensor in source._buffers.items():
            if tensor is not None:
                module._buffers[key] = tensor.to(device) if tensor.device != device else tensor.clone()
    return replica


def squared_norm(tensors: Iterable[torch.Tensor]) -> float:
    """``sum |t|^2`` over ``tensors`` (e.g. a model's gradients), in float64: |g|^2 of the noise scale."""
    return float(sum(t.double().pow(2).sum() for t in tensors))


def _gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters() if p.grad is not None]


def average_gradients(replicas: Sequence[nn.Module], weights: Sequence[float] | None = None) -> None:
    """The allreduce, by hand: set every replica's gradients to the weighted sum of all replicas' gradients.

    Gradients are gathered on the first replica's device, summed there, and copied back to each device:
    the "everything through one device" scheme whose traffic grows with the number of replicas.

    Args:
        replicas: models with the same architecture, after ``backward``.
        weights: one per replica, e.g. shard size / batch size (equal weights ``1/n`` if omitted).

    Raises:
        ValueError: a different number of weights than replicas, or a replica without gradients.
    """
    weights = [1 / len(replicas)] * len(replicas) if weights is None else list(weights)
    if len(weights) != len(replicas):
        raise ValueError(f"expected one weight per replica ({len(replicas)}), got {len(weights)}.")
    for params in zip(*(list(r.parameters()) for r in replicas), strict=True):
        if any(p.grad is None for p in params):
            raise ValueError("a replica has a parameter without gradient: call backward on every replica first.")
        home = params[0].grad.device
        total = sum(w * p.grad.to(home) for w, p in zip(weights, params, strict=True))
        for p in params:
            p.grad.copy_(total)


@dataclass(frozen=True)
class StepStats:
    """What one data-parallel step measured.

    Attributes:
        loss: mean loss over the global batch.
        local_grad_norm_sq: |g|^2 of a shard's own gradient, before averaging (a per-rank-batch gradient): on a
            rank, this rank's; in one process, the mean over the replicas.
        global_grad_norm_sq: |g|^2 of the averaged gradient (the global-batch gradient).
    """

    loss: float
    local_grad_norm_sq: float
    global_grad_norm_sq: float


def forward_backward(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                     loss_fn: LossFn = nn.functional.cross_entropy) -> torch.Tensor:
    """Zero ``model``'s gradients, then its loss on a batch (moved to the model's device) and its backward: what
    every worker computes, here, on a parameter server's worker (:mod:`course.naive.parameter_server`) or in DDP.

    Returns:
        The loss, detached.
    """
    device = next(model.parameters()).device
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs.to(device)), targets.to(device))
    loss.backward()
    return loss.detach()


def train_step(replicas: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
               inputs: torch.Tensor, targets: torch.Tensor,
               loss_fn: LossFn = nn.functional.cross_entropy) -> StepStats:
    """One data-parallel step on a global batch, in one process: split, forward/backward per replica, average, step.

    Args:
        replicas: from :func:`replicate`; optimizers: one per replica, same settings.
        inputs: ``(B, ...)`` global batch (any device); targets: ``(B,)`` class indices (for the default loss).
        loss_fn: a mean-reduced loss.

    Returns:
        The step's :class:`StepStats`: the loss of the whole global batch and the gradients' squared norms.
    """
    if len(optimizers) != len(replicas):
        raise ValueError(f"expected one optimizer per replica ({len(replicas)}), got {len(optimizers)}.")
    shards = split_batch(inputs, targets, len(replicas))
    weights = [len(y) / len(targets) for _, y in shards]  # shards may differ by one sample
    losses = [forward_backward(replica, x, y, loss_fn) for replica, (x, y) in zip(replicas, shards, strict=True)]
    local_norm_sq = sum(squared_norm(_gradients(replica)) for replica in replicas) / len(replicas)
    average_gradients(replicas, weights)
    for optimizer in optimizers:
        optimizer.step()
    loss = sum(weight * shard_loss.item() for weight, shard_loss in zip(weights, losses, strict=True))
    return StepStats(loss, local_norm_sq, squared_norm(_gradients(replicas[0])))


def max_replica_difference(replicas: Sequence[nn.Module]) -> float:
    """Largest absolute difference between any parameter of any replica and the first replica's (0 = identical)."""
    first = [p.detach().cpu() for p in replicas[0].parameters()]
    return max((float((p.detach().cpu() - q).abs().max()) for r in replicas[1:]
                for p, q in zip(r.parameters(), first, strict=True)), default=0.0)


def allreduce_gradients(model: nn.Module, group: dist.ProcessGroup | None = None,
                        loss: torch.Tensor | None = None) -> float | None:
    """On ranks: average every gradient over the process group with **one** ``dist.all_reduce``.

    The gradients (and ``loss``, if given) are copied into one flat buffer, reduced in one call and copied
    back: one message per step, as :func:`course.naive.who_works.train_on_rank0` broadcasts one (every collective makes
    all ranks wait for the slowest, which on shared cores costs more than the bytes). Each rank must have called
    ``backward`` on an equal-sized shard. Notebook 04b cuts the buffer into buckets so that communication can
    start during backward.

    Returns:
        The average of ``loss`` over the ranks, or None if no loss was given.
    """
    world_size = dist.get_world_size(group)
    grads = _gradients(model)
    extra = [loss.detach().reshape(1).to(grads[0].dtype if grads else torch.float32)] if loss is not None else []
    flat = torch.cat([g.reshape(-1) for g in grads] + extra)
    dist.all_reduce(flat, group=group)
    flat.div_(world_size)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return float(flat[-1]) if loss is not None else None


def rank_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
              loss_fn: LossFn = nn.functional.cross_entropy, clock: PhaseClock | None = None) -> StepStats:
    """Run inside a launched rank: one data-parallel step with ``dist.all_reduce``, what :func:`train_step` does in
    one process. This rank takes its shard of the global batch (:func:`split_batch`, equal shards), computes its
    gradient, averages gradients over the ranks (:func:`allreduce_gradients`) and steps; every rank that starts
    from the same model stays identical to the others and to one process on the whole batch.

    Args:
        inputs, targets: the global batch, the same on every rank; its size divisible by the world size.
        clock: if given, the step's seconds of ``"compute"`` (forward, backward, update) and ``"communicate"``
            (the allreduce, including waiting for the other ranks) are recorded in it.

    Returns:
        The step's :class:`StepStats` (the loss averaged over the ranks: the global batch's).

    Raises:
        ValueError: a global batch size not divisible by the world size.
    """
    x, y = split_batch(inputs, targets, dist.get_world_size(), equal=True)[dist.get_rank()]
    clock = PhaseClock() if clock is None else clock
    clock.new_step()
    with clock.phase("compute"):
        loss = forward_backward(model, x, y, loss_fn)
    local_norm_sq = squared_norm(_gradients(model))
    with clock.phase("communicate"):
        loss = allreduce_gradients(model, loss=loss)
    with clock.phase("compute"):
        optimizer.step()
    return StepStats(loss, local_norm_sq, squared_norm(_gradients(model)))


def train_on_ranks(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
                   optimizer: str = "sgd", clock: PhaseClock | None = None) -> list[float]:
    """Run inside a launched rank: data-parallel training, one :func:`rank_step` per global batch.

    Every rank starts from the same ``model`` and sees the same global ``batches``; rank ``r`` trains on shard
    ``r`` of each, so the ranks stay identical and equal one process on the whole batch.

    Args:
        optimizer: ``"sgd"``, ``"momentum"`` or ``"adam"`` (:func:`course.train.make_optimizer`).
        clock: as in :func:`rank_step`.

    Returns:
        The global-batch losses.

    Raises:
        ValueError: a global batch size not divisible by the world size.
    """
    optimizer_ = train.make_optimizer(optimizer, model.parameters(), lr)
    clock = PhaseClock() if clock is None else clock
    return [rank_step(model, optimizer_, inputs, targets, clock=clock).loss for inputs, targets in batches]


def replica_devices(world_size: int) -> list[torch.device]:
    """One device per replica: the GPUs in turn when there are some (``cuda:0, cuda:1, ...``), else the CPU."""
    from course import world

    gpus = world.detect_hardware().gpu_count
    return [world.device_for(i % gpus) if gpus else torch.device("cpu") for i in range(world_size)]
