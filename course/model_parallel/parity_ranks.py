"""The parity table's runs on ranks: the same few SGD steps of the transformer under each parallel strategy.

Each strategy is one function ``(config, training) -> [global-batch loss per step]``, the same list on every rank,
built from the course's own implementation of that strategy: data parallelism (``course.data_parallel``),
ZeRO-1 (its gradients averaged the same way, torch's ``ZeroRedundancyOptimizer`` sharding the momentum), FSDP
(FSDP2's ``fully_shard``, as in notebook 07), tensor and sequence parallelism (``tensor_parallel``,
``sequence_parallel``), the 1F1B pipeline (``pipeline``) and tensor x data parallelism (``mesh``). One more,
``summed gradients``, is data parallelism with a planted bug: the gradients are summed, not averaged.
:func:`train_on_rank` runs the strategies asked for, in turn. Used by :mod:`course.model_parallel.parity`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist

from course import data_parallel, world
from course.model_parallel import mesh, pipeline, schedules, sequence_parallel, tensor_parallel, transformer
from course.model_parallel.loss_bound import Training

Strategy = Callable[[transformer.Config, Training], list[float]]
MICRO_BATCHES = 4  # the pipeline's micro-batches per step


def _mean_over(value: torch.Tensor, group: dist.ProcessGroup | None = None) -> float:
    value = value.detach().reshape(1).clone()
    dist.all_reduce(value, group=group)
    return float(value) / dist.get_world_size(group)


def _my_share(inputs: torch.Tensor, targets: torch.Tensor, index: int, parts: int) -> tuple:
    return data_parallel.split_batch(inputs, targets, parts, equal=True)[index]


def _data_parallel(config: transformer.Config, training: Training, zero: bool = False, average: bool = True
                   ) -> list[float]:
    model = transformer.build(config, training.seed, world.current().device)
    if zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=training.lr,
                                            momentum=training.momentum)
    else:
        optimizer = training.optimizer(model.parameters())
    losses = []
    for inputs, targets in training.batches(config):
        x, y = _my_share(inputs, targets, dist.get_rank(), dist.get_world_size())
        optimizer.zero_grad(set_to_none=True)
        loss = transformer.loss(model(x), y)
        loss.backward()
        if average:
            losses.append(data_parallel.allreduce_gradients(model, loss=loss))
        else:  # the planted bug: every gradient summed over the ranks, never divided
            for p in model.parameters():
                dist.all_reduce(p.grad)
            losses.append(_mean_over(loss))
        optimizer.step()
    return losses


def data_parallel_run(config: transformer.Config, training: Training) -> list[float]:
    """Data parallelism: each rank its share of the batch, gradients averaged by one all-reduce."""
    return _data_parallel(config, training)


def zero1_run(config: transformer.Config, training: Training) -> list[float]:
    """ZeRO-1: data parallelism whose optimizer state (the momentum) is sharded over the ranks."""
    return _data_parallel(config, training, zero=True)


def summed_gradients_run(config: transformer.Config, training: Training) -> list[float]:
    """Data parallelism with a bug: gradients summed over the ranks, not averaged."""
    return _data_parallel(config, training, average=False)


def fsdp_run(config: transformer.Config, training: Training) -> list[float]:
    """FSDP (ZeRO-3): every block and the root sharded with FSDP2's ``fully_shard``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    me = world.current()
    model = transformer.build(config, training.seed, me.device)
    # FSDP2 warns that the head's output is a view: an in-place op on it would skip a hook. The loss does none.
    warnings.filterwarnings("ignore", message=".*returned a view tensor", category=UserWarning)
    device_mesh = init_device_mesh(me.device.type, (me.world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=device_mesh)
    fully_shard(model, mesh=device_mesh)
    optimizer = training.optimizer(model.parameters())
    losses = []
    for inputs, targets in training.batches(config):
        x, y = _my_share(inputs, targets, me.rank, me.world_size)
        optimizer.zero_grad(set_to_none=True)
        loss = transformer.loss(model(x), y)
        loss.backward()
        losses.append(_mean_over(loss))
        optimizer.step()
    return losses


def _whole_batch(model: torch.nn.Module, config: transformer.Config, training: Training,
                 after_backward: Callable[[], None] = lambda: None) -> list[float]:
    optimizer, losses = training.optimizer(model.parameters()), []
    for inputs, targets in training.batches(config):
        optimizer.zero_grad(set_to_none=True)
        loss = transformer.loss(model(inputs), targets)
        loss.backward()
        after_backward()
        losses.append(loss.item())
        optimizer.step()
    return losses


def tensor_parallel_run(config: transformer.Config, training: Training) -> list[float]:
    """Tensor parallelism over every rank: attention heads and MLP columns split, the whole batch on each."""
    model = tensor_parallel.parallelize(transformer.build(config, training.seed, world.current().device))
    return _whole_batch(model, config, training)


def sequence_parallel_run(config: transformer.Config, training: Training) -> list[float]:
    """Sequence parallelism over every rank: tensor parallelism with the norms cut along the sequence."""
    full = transformer.build(config, training.seed, world.current().device)
    model = sequence_parallel.SequenceParallelTransformer(full)
    return _whole_batch(model, config, training, lambda: sequence_parallel.sync_gradients(model))


def pipeline_run(config: transformer.Config, training: Training) -> list[float]:
    """Pipeline parallelism: one stage per rank, 1F1B over :data:`MICRO_BATCHES` micro-batches."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    stage = pipeline.split(transformer.build(config, training.seed, world.current().device), world_size)[rank]
    optimizer = training.optimizer(stage.parameters())
    ops = schedules.one_f_one_b(world_size, MICRO_BATCHES, rank)
    losses = []
    for inputs, targets in training.batches(config):
        optimizer.zero_grad(set_to_none=True)
        record = pipeline.run(stage, ops, inputs, targets, MICRO_BATCHES)
        loss = torch.tensor([record.loss])
        dist.broadcast(loss, world_size - 1)  # the last stage computed it
        losses.append(float(loss))
        optimizer.step()
    return losses


def tensor_x_data_run(config: transformer.Config, training: Training, tp_size: int = 2) -> list[float]:
    """Tensor x data parallelism: ``tp_size``-way tensor-parallel rows, data-parallel columns (``mesh``)."""
    grid = mesh.build_mesh(tp_size)
    model = tensor_parallel.parallelize(transformer.build(config, training.seed, world.current().device),
                                        grid.tp_group)
    optimizer, losses = training.optimizer(model.parameters()), []
    for inputs, targets in training.batches(config):
        x, y = _my_share(inputs, targets, grid.dp_rank, grid.dp_size)
        optimizer.zero_grad(set_to_none=True)
        loss = transformer.loss(model(x), y)
        loss.backward()
        mesh.average_gradients(model, grid)
        losses.append(_mean_over(loss, grid.dp_group))
        optimizer.step()
    return losses


STRATEGIES: dict[str, Strategy] = {
    "data parallel": data_parallel_run, "ZeRO-1": zero1_run, "FSDP": fsdp_run,
    "tensor parallel": tensor_parallel_run, "sequence parallel": sequence_parallel_run,
    "pipeline (1F1B)": pipeline_run, "tensor x data (2 x 2)": tensor_x_data_run,
    "summed gradients (a bug)": summed_gradients_run,
}


def train_on_rank(config: transformer.Config, training: Training, names: tuple[str, ...]) -> dict[str, list[float]]:
    """Run inside a launched rank: each strategy of ``names`` in turn. Returns name -> its losses, step by step."""
    return {name: STRATEGIES[name](config, training) for name in names}
