"""2-D parallelism: tensor parallelism inside groups of ``t`` ranks, data parallelism across them.

The ``world_size = t x d`` ranks form a grid (a *device mesh*); rank ``r`` sits at row ``r // t`` (its data-parallel
index) and column ``r % t`` (its tensor-parallel index)::

    t = 2, d = 2:        tensor-parallel groups (rows)     data-parallel groups (columns)
        0  1                 {0, 1}  {2, 3}                     {0, 2}  {1, 3}
        2  3

A tensor-parallel group splits every block's weights (``tensor_parallel.parallelize(model, tp_group)``) and
all-reduces activations, four times per block and micro-batch: it wants the fastest link, inside a node. A
data-parallel group holds the same shards and all-reduces their gradients once per step. Every rank must create
every group, in the same order (``dist.new_group`` is itself a collective), even the groups it is not in.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import world
from course.model_parallel.tensor_parallel import compare_gradients, parallelize
from course.model_parallel.transformer import Config as TransformerConfig
from course.model_parallel.transformer import build, loss, sample_batch
from course.runtime.comm_log import CommLog


@dataclass(frozen=True)
class Mesh:
    """This rank's place in the grid and its two groups."""

    tp_size: int
    dp_size: int
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    tp_ranks: tuple[int, ...]  # global ranks of this rank's tensor-parallel group
    dp_ranks: tuple[int, ...]  # global ranks of this rank's data-parallel group

    @property
    def dp_rank(self) -> int:
        return dist.get_rank() // self.tp_size


def grid(world_size: int, tp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(tensor-parallel groups, data-parallel groups)``: rows and columns of the ``d x t`` grid of ranks.

    Raises:
        ValueError: a tensor-parallel size that does not divide the world size.
    """
    if tp_size < 1 or world_size % tp_size:
        raise ValueError(f"tp_size={tp_size} must divide world_size={world_size} into whole tensor-parallel groups: "
                         f"pick one of {[t for t in range(1, world_size + 1) if world_size % t == 0]}.")
    rows = [list(range(d * tp_size, (d + 1) * tp_size)) for d in range(world_size // tp_size)]
    return rows, [list(column) for column in zip(*rows, strict=True)]


def build_mesh(tp_size: int) -> Mesh:
    """Create every tensor- and data-parallel group (on every rank, in the same order); return this rank's."""
    rank = dist.get_rank()
    rows, columns = grid(dist.get_world_size(), tp_size)
    mine = {}
    for kind, groups in (("tp", rows), ("dp", columns)):
        for ranks in groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = (group, tuple(ranks))
    return Mesh(tp_size, len(rows), mine["tp"][0], mine["dp"][0], mine["tp"][1], mine["dp"][1])


def average_gradients(model: torch.nn.Module, mesh: Mesh) -> None:
    """Data parallelism across the mesh's columns: average every gradient over this rank's data-parallel group."""
    for p in model.parameters():
        dist.all_reduce(p.grad, group=mesh.dp_group)
        p.grad /= mesh.dp_size


def step_on_rank(config: TransformerConfig, tp_size: int = 2, batch_size: int = 8, seed: int = 0) -> dict:
    """Run inside a launched rank: one step of the transformer split ``tp_size`` ways, each data-parallel replica on
    its share of the batch, gradients averaged across replicas; compared with one device on the whole batch.

    Returns:
        ``{"tp_ranks", "dp_ranks", "grad_error": {name: largest |difference|}, "allreduces": {"tensor parallel":
        calls in forward and backward, "data parallel": calls averaging the gradients}}``.
    """
    mesh = build_mesh(tp_size)
    device = world.current().device
    full = build(config, seed, device)
    inputs, targets = sample_batch(config, batch_size, seed, device)
    parallel = parallelize(full, mesh.tp_group)
    mine = slice(mesh.dp_rank * batch_size // mesh.dp_size, (mesh.dp_rank + 1) * batch_size // mesh.dp_size)
    with CommLog() as tensor_calls:
        loss(parallel(inputs[mine]), targets[mine]).backward()
    with CommLog() as data_calls:
        average_gradients(parallel, mesh)
    loss(full(inputs), targets).backward()
    return {"tp_ranks": mesh.tp_ranks, "dp_ranks": mesh.dp_ranks, "grad_error": compare_gradients(parallel, full),
            "allreduces": {"tensor parallel": sum(c.name == "all_reduce" for c in tensor_calls.calls),
                           "data parallel": sum(c.name == "all_reduce" for c in data_calls.calls)}}
