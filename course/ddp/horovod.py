"""Horovod's recipe around the distributed optimizer: one start, one optimizer state and one metric for all ranks.

A training script adds, as with Horovod::

    rank = horovod.init()                                    # = course.world.init_from_env()
    horovod.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    horovod.broadcast_optimizer_state(optimizer, root_rank=0)
    ...
    loss = horovod.allreduce_metric(loss)

The broadcasts make every rank start from rank ``root_rank``'s weights and optimizer state (averaged gradients
keep identical replicas identical, but cannot bring differing ones together); :func:`allreduce_metric` turns
each rank's metric into the one every rank reports. :func:`recipe` runs the whole recipe. Taught in
``notebooks/04b_distributed_optimizer.ipynb``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist

from course import world
from course.arguments import check_choice
from course.collectives import allreduce
from course.ddp.distributed_optimizer import OPS, DistributedOptimizer
from course.world import init_from_env as init  # Horovod's API shape: hvd.init()


def _tensors_of(params: Mapping[str, torch.Tensor] | Iterable) -> list[torch.Tensor]:
    items = list(params.values()) if isinstance(params, Mapping) else list(params)
    tensors = [item[1] if isinstance(item, tuple) else item for item in items]
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"expected tensors, a state_dict or named_parameters, got a {type(tensor).__name__}.")
    return tensors


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable, root_rank: int = 0,
                         group: dist.ProcessGroup | None = None) -> None:
    """Overwrite, in place, every rank's tensors with ``root_rank``'s: the same starting point everywhere.

    Args:
        params: ``model.state_dict()`` (parameters and buffers), ``model.named_parameters()`` or tensors.
        root_rank: the rank whose values win.
    """
    with torch.no_grad():
        for tensor in _tensors_of(params):
            buffer = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
            dist.broadcast(buffer, src=root_rank, group=group)
            if buffer.data_ptr() != tensor.data_ptr():
                tensor.copy_(buffer)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer | DistributedOptimizer, root_rank: int = 0,
                              group: dist.ProcessGroup | None = None) -> None:
    """Give every rank ``root_rank``'s optimizer state (momentum, Adam moments, step counts, learning rates).

    Works for any optimizer, also when the other ranks have no state yet (e.g. resuming from rank 0's checkpoint).
    """
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    holder = [inner.state_dict() if dist.get_rank(group) == root_rank else None]
    dist.broadcast_object_list(holder, src=root_rank, group=group)
    if dist.get_rank(group) != root_rank:
        inner.load_state_dict(holder[0])


def allreduce_metric(value: float | torch.Tensor, op: str = "avg", algorithm: str = "ring",
                     group: dist.ProcessGroup | None = None) -> float | torch.Tensor:
    """Average (or sum) a metric over ranks, e.g. each rank's validation loss.

    Averaging per-rank means is only right when every rank saw as many samples; otherwise reduce sums and
    counts, ``allreduce_metric(torch.tensor([loss_sum, count]), op="sum")``, and divide.

    Returns:
        A float for a number, a new float64 tensor for a tensor; the input is not modified.
    """
    check_choice("op", op, OPS)
    # a number goes on the rank's device: nccl reduces GPU tensors only
    device = value.device if isinstance(value, torch.Tensor) else world.current().device
    tensor = torch.as_tensor(value, dtype=torch.float64, device=device).clone()
    if dist.is_initialized():
        allreduce.ALGORITHMS[check_choice("algorithm", algorithm, allreduce.ALGORITHMS)](tensor, op=op, group=group)
    return tensor if isinstance(value, torch.Tensor) else tensor.item()


# -- for notebook 04b -------------------------------------------------------------------------------------------
def recipe(steps: int = 5, batch_size: int = 16, seed: int = 0) -> dict[str, object]:
    """Rank function for notebook 04b: the whole Horovod recipe, from differing random starts to one metric.

    Every rank builds its model with its own seed and its optimizer with its own learning rate (as if
    misconfigured), then: :func:`init`, :func:`broadcast_parameters` and :func:`broadcast_optimizer_state` from
    rank 0, ``steps`` steps of :class:`DistributedOptimizer` on this rank's shard of a synthetic regression
    (``batch_size`` samples per rank per step), and :func:`allreduce_metric` of the shard's loss.

    Returns:
        Plain numbers: ``lr_before``/``lr_after``, the first weight ``weight_before``/``weight_after`` the
        broadcast, ``weights`` after training (all of them), this rank's ``loss`` and the ``avg_loss`` over ranks.
    """
    rank = init()
    torch.manual_seed(seed + rank.rank)  # a different start on every rank ...
    model = torch.nn.Linear(4, 1).to(rank.device)
    inner = torch.optim.SGD(model.parameters(), lr=0.05 * (rank.rank + 1), momentum=0.9)
    weight_before, lr_before = model.weight[0, 0].item(), inner.param_groups[0]["lr"]
    broadcast_parameters(model.state_dict(), root_rank=0)  # ... until rank 0's wins
    optimizer = DistributedOptimizer(inner, model.named_parameters())
    broadcast_optimizer_state(optimizer, root_rank=0)
    generator = torch.Generator().manual_seed(seed)  # one dataset; each rank takes its own rows
    x = torch.randn(steps * batch_size * rank.world_size, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(len(x), 1, generator=generator)
    x, y = x[rank.rank::rank.world_size], y[rank.rank::rank.world_size]  # (steps * batch_size, 4), (.., 1)
    x, y = x.to(rank.device), y.to(rank.device)
    try:
        for step in range(steps):
            rows = slice(step * batch_size, (step + 1) * batch_size)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
    finally:
        optimizer.close()
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x), y).item()
    return {"lr_before": lr_before, "lr_after": optimizer.param_groups[0]["lr"], "weight_before": weight_before,
            "weight_after": model.weight[0, 0].item(), "weights": model.weight.flatten().tolist(),
            "loss": loss, "avg_loss": allreduce_metric(loss)}
