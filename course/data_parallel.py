"""Data parallelism by hand: replicate the model, split the batch, average the gradients, step.

What people write before they know DDP (d2l.ai 13.5, "Training on Multiple GPUs" from scratch). Five named
steps, each a small function:

    shards = split_batch(images, labels, len(replicas))      # one shard per replica
    for replica, (x, y) in zip(replicas, shards): backward    # each replica: its shard's gradient
    average_gradients(replicas, shard_sizes)                  # the "allreduce", by hand, in one process
    for optimizer in optimizers: optimizer.step()             # identical updates keep replicas identical

:func:`train_step` composes them; it equals one process training on the whole batch (to float rounding),
which is notebook 02's "k ranks x batch b == one process with batch k*b". On ranks, :func:`allreduce_gradients`
is the same average with ``dist.all_reduce``. Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course.timing import PhaseClock
from course.validation import check_choice, check_count


def split_batch(inputs: torch.Tensor, targets: torch.Tensor, num_replicas: int
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch into ``num_replicas`` contiguous shards whose sizes differ by at most one.

    Args:
        inputs: ``(B, ...)``; targets: ``(B, ...)``, same ``B``.
        num_replicas: number of shards, 1 <= num_replicas <= B.

    Returns:
        ``[(inputs_0, targets_0), ...]``, views into the inputs; the first ``B % num_replicas`` shards are
        one sample larger.

    Raises:
        ValueError: mismatched batch dimensions, or fewer samples than replicas (a replica would get nothing).
    """
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive integer, got {num_replicas!r}.")
    if inputs.ndim == 0 or targets.ndim == 0 or len(inputs) != len(targets):
        raise ValueError(f"inputs and targets need the same batch dimension, got shapes {tuple(inputs.shape)} "
                         f"and {tuple(targets.shape)}.")
    if len(inputs) < num_replicas:
        raise ValueError(f"a batch of {len(inputs)} samples cannot feed {num_replicas} replicas: every replica "
                         f"needs at least one sample. Use a global batch size of at least {num_replicas}.")
    return list(zip(torch.tensor_split(inputs, num_replicas), torch.tensor_split(targets, num_replicas),
                    strict=True))


def replicate(model: nn.Module, devices: Sequence[torch.device | str]) -> list[nn.Module]:
    """One independent copy of ``model`` on each device (same initial parameters everywhere).

    Raises:
        ValueError: no devices.
    """
    if len(devices) == 0:
        raise ValueError("replicate() needs at least one device, got none.")
    return [copy.deepcopy(model).to(device) for device in devices]


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


def train_step(replicas: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer],
               inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """One data-parallel step on a global batch: split, forward/backward per replica, average, step.

    Args:
        replicas: from :func:`replicate`; optimizers: one per replica, same settings.
        inputs: ``(B, ...)`` global batch (any device); targets: ``(B,)`` class indices.

    Returns:
        The cross-entropy loss of the whole global batch (mean over its samples).
    """
    if len(optimizers) != len(replicas):
        raise ValueError(f"expected one optimizer per replica ({len(replicas)}), got {len(optimizers)}.")
    shards = split_batch(inputs, targets, len(replicas))
    weights = [len(y) / len(targets) for _, y in shards]  # shards may differ by one sample
    loss = 0.0
    for replica, optimizer, (x, y), weight in zip(replicas, optimizers, shards, weights, strict=True):
        device = next(replica.parameters()).device
        optimizer.zero_grad(set_to_none=True)
        shard_loss = nn.functional.cross_entropy(replica(x.to(device)), y.to(device))
        shard_loss.backward()
        loss += weight * shard_loss.item()
    average_gradients(replicas, weights)
    for optimizer in optimizers:
        optimizer.step()
    return loss


def max_replica_difference(replicas: Sequence[nn.Module]) -> float:
    """Largest absolute difference between any parameter of any replica and the first replica's (0 = identical)."""
    first = [p.detach().cpu() for p in replicas[0].parameters()]
    return max((float((p.detach().cpu() - q).abs().max()) for r in replicas[1:]
                for p, q in zip(r.parameters(), first, strict=True)), default=0.0)


def allreduce_gradients(model: nn.Module, group: dist.ProcessGroup | None = None,
                        loss: torch.Tensor | None = None) -> float | None:
    """On ranks: average every gradient over the process group with **one** ``dist.all_reduce``.

    The gradients (and ``loss``, if given) are copied into one flat buffer, reduced in one call and copied
    back: one message per step, as :func:`train_on_rank0` broadcasts one (every collective makes all ranks
    wait for the slowest, which on shared cores costs more than the bytes). Each rank must have called
    ``backward`` on an equal-sized shard. Notebook 04b cuts the buffer into buckets so that communication can
    start during backward.

    Returns:
        The average of ``loss`` over the ranks, or None if no loss was given.
    """
    world_size = dist.get_world_size(group)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    extra = [loss.detach().reshape(1).to(grads[0].dtype if grads else torch.float32)] if loss is not None else []
    flat = torch.cat([g.reshape(-1) for g in grads] + extra)
    dist.all_reduce(flat, group=group)
    flat.div_(world_size)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return float(flat[-1]) if loss is not None else None


def global_batches(dataset: torch.utils.data.Dataset, batch_size: int, steps: int, seed: int = 0
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``steps`` global batches of a seeded shuffled loader (cycling epochs): the same on every rank.

    Args:
        batch_size: global batch size (all replicas together). steps: number of batches.
    """
    from course.data import loader

    steps = check_count("steps", steps, unit="number of batches")
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    epoch = 0
    while len(batches) < steps:
        batches += list(loader(dataset, batch_size, shuffle=True, seed=seed + epoch, drop_last=True))
        epoch += 1
    return batches[:steps]


def make_optimizer(name: str, parameters: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """``"sgd"`` (plain SGD) or ``"adam"`` over ``parameters``, at learning rate ``lr``.

    Raises:
        ValueError: another name.
    """
    choices = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
    return choices[check_choice("optimizer", name, choices)](parameters, lr=lr)


def train_on_ranks(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
                   optimizer: str = "sgd", clock: PhaseClock | None = None) -> list[float]:
    """Run inside a launched rank: data-parallel training with ``dist.all_reduce``; returns the global-batch losses.

    Every rank starts from the same ``model`` and sees the same global ``batches``; rank ``r`` trains on shard
    ``r`` of each (:func:`split_batch`), so the ranks stay identical and equal one process on the whole batch.
    Shards must be of equal size (global batch size divisible by the world size) for the plain average to be
    the full-batch gradient.

    Args:
        optimizer: ``"sgd"`` or ``"adam"`` (:func:`make_optimizer`). clock: if given, each step's seconds of
            ``"compute"`` (forward, backward, update) and ``"communicate"`` (the allreduces, including waiting
            for the other ranks) are recorded in it.

    Raises:
        ValueError: a global batch size not divisible by the world size.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = next(model.parameters()).device
    optimizer_ = make_optimizer(optimizer, model.parameters(), lr)
    clock = PhaseClock() if clock is None else clock
    losses = []
    for inputs, targets in batches:
        if len(targets) % world_size:
            raise ValueError(f"global batch size {len(targets)} is not divisible by world_size {world_size}: "
                             "shards would differ and a plain average would weight samples unequally.")
        x, y = split_batch(inputs, targets, world_size)[rank]
        clock.new_step()
        with clock.phase("compute"):
            optimizer_.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
        with clock.phase("communicate"):
            losses.append(allreduce_gradients(model, loss=loss))
        with clock.phase("compute"):
            optimizer_.step()
    return losses


def train_on_rank0(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
                   optimizer: str = "sgd", clock: PhaseClock | None = None) -> list[float]:
    """Run inside a launched rank: the naive way to "use" several GPUs, for contrast with :func:`train_on_ranks`.

    Rank 0 trains on every whole global batch and broadcasts the new parameters (one flat message per step);
    the other ranks only wait for them. The result is one process's training (same losses, same parameters on
    every rank), at one process's speed: one GPU computes, the others wait, which
    ``notebooks/03_naive_multi_gpu.ipynb`` measures (``clock``) and watches with :mod:`course.monitor`.

    Args:
        optimizer, clock: as in :func:`train_on_ranks` (``"communicate"`` is the broadcast, waiting included).

    Returns:
        The global-batch losses (rank 0's, on every rank).
    """
    device = next(model.parameters()).device
    optimizer_ = make_optimizer(optimizer, model.parameters(), lr)
    clock = PhaseClock() if clock is None else clock
    losses = []
    for inputs, targets in batches:
        clock.new_step()
        loss = torch.zeros(1, device=device)
        if dist.get_rank() == 0:
            with clock.phase("compute"):
                optimizer_.zero_grad(set_to_none=True)
                step_loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
                step_loss.backward()
                optimizer_.step()
                loss = step_loss.detach().reshape(1)
        with clock.phase("communicate"):
            flat = torch.cat([parameters_to_vector(model.parameters()).detach(), loss])  # one message per step
            dist.broadcast(flat, src=0)
            vector_to_parameters(flat[:-1], model.parameters())
        losses.append(float(flat[-1]))
    return losses


def replica_devices(num_replicas: int) -> list[torch.device]:
    """One device per replica: the GPUs in turn when there are some (``cuda:0, cuda:1, ...``), else the CPU."""
    from course import world

    gpus = world.detect_hardware().gpu_count
    return [world.device_for(i % gpus) if gpus else torch.device("cpu") for i in range(num_replicas)]
