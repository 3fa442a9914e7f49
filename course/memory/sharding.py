"""ZeRO for real: shard optimizer state (ZeRO-1), gradients too (ZeRO-2) or everything (FSDP, ZeRO-3) on N ranks,
and check each against DDP.

Rank functions for :func:`course.runtime.launch.launch`. Each trains a seeded model with DDP and a copy with the sharded
method side by side for ``steps`` steps on the same per-rank batches, and returns how far apart the parameters
ended and the bytes this rank holds, measured (``numel x element_size`` of the local tensors) beside the
estimate of :func:`course.memory.budget.model_states`. ZeRO-1 is ``torch.distributed.optim.ZeroRedundancyOptimizer``
(whole parameters are assigned to ranks, so shards are only roughly Ψ/N); FSDP is FSDP2's ``fully_shard``
(every parameter split into N row chunks, so shards are Ψ/N up to rounding). ZeRO-2 is approached by the same
with ``reshard_after_forward=False``: parameters stay whole from forward through backward, as in ZeRO-2, but go
back to the shard between steps, where ZeRO-2 keeps them whole; torch has no ZeRO-2 of its own. Rajbhandari et al. 2020,
https://arxiv.org/abs/1910.02054. Taught in ``notebooks/07_memory.ipynb``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from course import train, world
from course.memory import budget as memory_budget
from course.memory import measure as memory_measure
from course.models import MLP

LR = 1e-3


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MLP(hidden=(96, 48))  # 11,386 parameters in 6 tensors, first dims 96, 48, 10: uneven on 4 ranks


def _batch(step: int, batch_size: int, me: world.Rank) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of global batch ``step`` (the same on every rank and for both methods)."""
    generator = torch.Generator().manual_seed(1000 + step)
    images = torch.randn(me.world_size * batch_size, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (me.world_size * batch_size,), generator=generator)
    rows = slice(me.rank * batch_size, (me.rank + 1) * batch_size)
    return images[rows].to(me.device), labels[rows].to(me.device)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, batch_size: int, me: world.Rank) -> None:
    for step in range(steps):
        images, labels = _batch(step, batch_size, me)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()


def _ddp_reference(seed: int, optimizer: str, steps: int, batch_size: int, me: world.Rank) -> nn.Module:
    model = DistributedDataParallel(_model(seed).to(me.device))
    _train(model, train.make_optimizer(optimizer, model.parameters(), LR), steps, batch_size, me)
    return model.module


def _max_diff(reference: nn.Module, params: list[torch.Tensor]) -> float:
    return max((a.detach() - b).abs().max().item() for a, b in zip(reference.parameters(), params, strict=True))


def _estimate(optimizer: str, stage: int, me: world.Rank, model: nn.Module) -> dict[str, float]:
    params = list(model.parameters())
    setup = memory_budget.Setup(optimizer, zero_stage=stage, world_size=me.world_size)
    ideal = memory_budget.model_states(sum(p.numel() for p in params), setup, len(params))
    return {"ideal_parameters": ideal.parameters, "ideal_gradients": ideal.gradients,
            "ideal_optimizer_state": ideal.optimizer_state}


def zero1_vs_ddp(optimizer: str = "adam", steps: int = 3, batch_size: int = 8, seed: int = 0) -> dict[str, float]:
    """Rank function: DDP + ``ZeroRedundancyOptimizer`` (ZeRO-1) against plain DDP after ``steps`` steps.

    Returns ``max_diff`` (largest |DDP - ZeRO-1| parameter), measured ``parameters``/``gradients``/
    ``optimizer_state`` bytes on this rank, ``owned_optimizer_state``: the estimate for the parameters this
    rank's shard really holds (bytes per parameter x their count, + Adam's step counters), and the even-split
    estimates ``ideal_*``.
    """
    me = world.current()
    reference = _ddp_reference(seed, optimizer, steps, batch_size, me)
    model = DistributedDataParallel(_model(seed).to(me.device))
    optimizer_class = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "momentum": torch.optim.SGD}[optimizer]
    extra = {"momentum": 0.9} if optimizer == "momentum" else {}
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class, lr=LR, **extra)
    _train(model, zero, steps, batch_size, me)
    owned = [p for group in zero.optim.param_groups for p in group["params"]]
    unit = memory_budget.bytes_per_parameter(memory_budget.Setup(optimizer))
    owned_estimate = (unit.optimizer_state * sum(p.numel() for p in owned)
                      + memory_budget.STEP_COUNTER_BYTES[optimizer] * len(owned))
    measured = memory_measure.measure(model.module, zero.optim)
    return {"max_diff": _max_diff(reference, list(model.module.parameters())), "parameters": measured.parameters,
            "gradients": measured.gradients, "optimizer_state": measured.optimizer_state,
            "owned_optimizer_state": owned_estimate, **_estimate(optimizer, 1, me, model.module)}


def fsdp_vs_ddp(optimizer: str = "adam", steps: int = 3, batch_size: int = 8, seed: int = 0) -> dict[str, float]:
    """Rank function: FSDP2 ``fully_shard`` (ZeRO-3) against DDP after ``steps`` steps.

    Every linear layer and the root are sharded, so each parameter lives as one row chunk per rank (a DTensor).
    Returns ``max_diff`` (largest |DDP - FSDP| of the full parameters), measured local ``parameters``,
    ``gradients`` and ``optimizer_state`` bytes, ``chunk_parameters``: the estimate for this rank's row chunks
    (``torch.chunk`` of every parameter's first dimension, x 4 bytes), ``parameters_after_forward``: the
    parameter bytes held between one more forward and its backward (ZeRO-3 frees each layer's gathered
    parameters after its forward: the shards only), and the even-split ``ideal_*``.
    """
    return _fully_sharded_vs_ddp(optimizer, steps, batch_size, seed, reshard_after_forward=True)


def zero2_vs_ddp(optimizer: str = "adam", steps: int = 3, batch_size: int = 8, seed: int = 0) -> dict[str, float]:
    """Rank function: FSDP2 without resharding, ``fully_shard(..., reshard_after_forward=False)``, against DDP.

    It is ZeRO-2 during a step and less than ZeRO-2 between steps (only the parameter shard is kept).

    Gradients are reduce-scattered and the optimizer state is sharded, as in ZeRO-2; the parameters, gathered
    before forward, stay whole until backward is done (no second gather in backward, ZeRO-2's communication),
    and only then go back to the shard. So ``parameters_after_forward`` is the whole model (ZeRO-2's replicated
    parameters, at the step's peak), while ``parameters`` measured between steps is the shard: FSDP2 keeps less
    at rest than the ZeRO paper's stage 2. Returns the keys of :func:`fsdp_vs_ddp`, ``ideal_*`` for stage 2.
    """
    return _fully_sharded_vs_ddp(optimizer, steps, batch_size, seed, reshard_after_forward=False)


def _fully_sharded_vs_ddp(optimizer: str, steps: int, batch_size: int, seed: int, reshard_after_forward: bool
                          ) -> dict[str, float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    me = world.current()
    reference = _ddp_reference(seed, optimizer, steps, batch_size, me)
    model = _model(seed).to(me.device)
    chunks = sum(_chunk_numel(p.shape, me.world_size, me.rank) for p in model.parameters())
    ideal = _estimate(optimizer, 3 if reshard_after_forward else 2, me, model)
    mesh = init_device_mesh(me.device.type, (me.world_size,))
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fsdp_optimizer = train.make_optimizer(optimizer, model.parameters(), LR)
    _train(model, fsdp_optimizer, steps, batch_size, me)
    full = [p.full_tensor() for p in model.parameters()]
    measured = memory_measure.measure(model, fsdp_optimizer)
    return {"max_diff": _max_diff(reference, full), "parameters": measured.parameters,
            "gradients": measured.gradients, "optimizer_state": measured.optimizer_state,
            "chunk_parameters": 4 * chunks, "parameters_after_forward": _parameters_after_forward(model, me),
            **ideal}


def _parameters_after_forward(model: nn.Module, me: world.Rank) -> int:
    """Parameter bytes this rank holds between a forward and its backward (the backward then runs, no step)."""
    images, labels = _batch(0, 1, me)
    loss = nn.functional.cross_entropy(model(images), labels)
    held = memory_measure.tensor_bytes(model.parameters())
    loss.backward()
    model.zero_grad()
    return held


def _chunk_numel(shape: torch.Size, world_size: int, rank: int) -> int:
    """Elements of rank ``rank``'s chunk when dim 0 is split like ``torch.chunk`` (FSDP2's row sharding)."""
    rows = -(-shape[0] // world_size)
    mine = max(0, min(rows, shape[0] - rank * rows))
    return mine * (shape[1:].numel() if len(shape) > 1 else 1)


def both(optimizer: str = "adam", steps: int = 3) -> dict[str, dict[str, float]]:
    """Rank function: :func:`zero1_vs_ddp`, :func:`zero2_vs_ddp` and :func:`fsdp_vs_ddp` in one launch
    (starting ranks is slow)."""
    results = {"zero1": zero1_vs_ddp(optimizer, steps), "zero2": zero2_vs_ddp(optimizer, steps),
               "fsdp": fsdp_vs_ddp(optimizer, steps)}
    dist.barrier()
    return results


def each_optimizer(optimizers: tuple[str, ...] = ("sgd", "momentum", "adam"), steps: int = 3
                   ) -> dict[str, dict[str, dict[str, float]]]:
    """Rank function: :func:`both` for each optimizer, in one launch."""
    return {optimizer: both(optimizer, steps) for optimizer in optimizers}

