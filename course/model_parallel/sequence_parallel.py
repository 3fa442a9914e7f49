"""Sequence parallelism (Korthikanti et al. 2022): the activations tensor parallelism still replicates, split by
position along the sequence.

Under tensor parallelism (``tensor_parallel``) the norms, the residual stream and the inputs of the column-parallel
linears are whole on every rank: ``t`` ranks hold ``t`` copies. Sequence parallelism keeps the residual stream cut
along the sequence, ``(B, S/t, d)`` per rank, and swaps each all-reduce for its two halves::

    norm (on S/t) -> all-gather (S/t -> S) -> column-parallel ... row-parallel -> reduce-scatter (S -> S/t)

so the layer norms run on ``S/t`` positions and nothing whole is kept for backward: the column-parallel linear saves
its input slice and gathers it again in backward (:class:`GatherLinear`, as Megatron-LM does). The bytes sent are
the same as the all-reduce's (a reduce-scatter plus an all-gather *is* a ring all-reduce). The norms' weights and
the row-parallel biases now see only their ``S/t`` positions, so their gradients are summed over the group after
backward (:func:`sync_gradients`). :func:`saved_bytes` measures what a rank keeps for backward.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from course import world
from course.memory.activations import measure_bytes
from course.model_parallel.tensor_parallel import (
    ColumnParallelLinear,
    ParallelAttention,
    ParallelMLP,
    compare_gradients,
    parallelize,
)
from course.model_parallel.transformer import Config as TransformerConfig
from course.model_parallel.transformer import Transformer, build, loss, sample_batch
from course.runtime.comm_log import CommLog


def all_gather_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``(B, S/t, d)`` on each rank -> ``(B, S, d)``, the ranks' slices in rank order (no autograd)."""
    shard = x.transpose(0, 1).contiguous()  # (S/t, B, d): gather along dim 0
    out = shard.new_empty((shard.shape[0] * dist.get_world_size(group), *shard.shape[1:]))
    dist.all_gather_single(out, shard, group=group)
    return out.transpose(0, 1)


def reduce_scatter_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``(B, S, d)`` partial sums on each rank -> ``(B, S/t, d)``: this rank's positions, summed (no autograd)."""
    whole = x.transpose(0, 1).contiguous()  # (S, B, d)
    out = whole.new_empty((whole.shape[0] // dist.get_world_size(group), *whole.shape[1:]))
    dist.reduce_scatter_single(out, whole, group=group)
    return out.transpose(0, 1)


def _my_positions(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x.chunk(dist.get_world_size(group), dim=1)[dist.get_rank(group)].contiguous()


class ReduceScatterSequence(torch.autograd.Function):
    """Leaving a row-parallel linear: reduce-scatter forward, all-gather backward (replaces *g*)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return all_gather_sequence(grad, ctx.group), None


class GatherLinear(torch.autograd.Function):
    """Entering a column-parallel linear: all-gather the input, multiply; keep only the slice for backward, where
    the input is gathered again and its gradient reduce-scattered (replaces *f*)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,  # noqa: ANN001
                group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        ctx.save_for_backward(x, weight)
        return F.linear(all_gather_sequence(x, group), weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # noqa: ANN001
        x, weight = ctx.saved_tensors
        whole = all_gather_sequence(x, ctx.group)  # (B, S, d), gathered again rather than kept
        grad_input = reduce_scatter_sequence(grad @ weight, ctx.group)
        grad_weight = grad.flatten(0, 1).T @ whole.flatten(0, 1)
        return grad_input, grad_weight, grad.sum(dim=(0, 1)), None


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """A column-parallel linear whose input arrives cut along the sequence (:class:`GatherLinear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GatherLinear.apply(x, self.weight, self.bias, self.group)


class ScatterToSequence(torch.autograd.Function):
    """Into the blocks: keep this rank's positions of a replicated tensor; backward, gather the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return _my_positions(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return all_gather_sequence(grad, ctx.group), None


class GatherFromSequence(torch.autograd.Function):
    """Out of the blocks: gather the positions for the replicated head; backward, keep this rank's positions."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return all_gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return _my_positions(grad, ctx.group), None


class SequenceParallelTransformer(nn.Module):
    """A transformer with tensor- and sequence-parallel blocks; embeddings and head whole on every rank.

    Raises:
        ValueError: a sequence length that the group does not divide.
    """

    def __init__(self, model: Transformer, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.group, self.model = group, copy.deepcopy(model)
        for block in self.model.blocks:
            block.attention = ParallelAttention(block.attention, group, SequenceParallelColumnLinear,
                                                ReduceScatterSequence.apply)
            block.mlp = ParallelMLP(block.mlp, group, SequenceParallelColumnLinear, ReduceScatterSequence.apply)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        world_size = dist.get_world_size(self.group)
        if tokens.shape[1] % world_size:
            raise ValueError(f"sequence parallelism cuts the {tokens.shape[1]} positions over {world_size} ranks: "
                             "use a sequence length that the tensor-parallel size divides.")
        x = ScatterToSequence.apply(self.model.embed(tokens), self.group)  # (B, S/t, d)
        for block in self.model.blocks:
            x = block(x)
        x = GatherFromSequence.apply(x, self.group)  # (B, S, d)
        return self.model.head(self.model.norm(x))


def sync_gradients(model: SequenceParallelTransformer) -> None:
    """Sum over the group the gradients of the parameters that saw only this rank's positions: the blocks'
    norms and the row-parallel biases. Call after backward, before comparing or stepping."""
    for block in model.model.blocks:
        for p in (*block.norm1.parameters(), *block.norm2.parameters(), block.attention.proj.bias,
                  block.mlp.fc2.bias):
            dist.all_reduce(p.grad, group=model.group)


def saved_bytes(block: nn.Module, x: torch.Tensor) -> int:
    """Bytes one block keeps for backward on this rank (``course.memory.activations.measure_bytes``: each storage once,
    parameters left out) for its input ``x``: ``(B, S, d)`` whole, or ``(B, S/t, d)`` under sequence parallelism."""
    return measure_bytes(block, x.detach().requires_grad_())


def step_on_rank(config: TransformerConfig, batch_size: int = 8, seed: int = 0) -> dict:
    """Run inside a launched rank: one step of the sequence-parallel transformer beside the unsplit model, and
    the bytes one block keeps for backward unsplit, tensor-parallel and sequence-parallel.

    Returns:
        ``{"logits_error", "grad_error": {name: largest |difference|}, "calls": {"forward", "backward"}: [Call],
        "saved_bytes": {"unsplit", "tensor parallel", "sequence parallel"}}`` on this rank.
    """
    device = world.current().device
    full = build(config, seed, device)
    inputs, targets = sample_batch(config, batch_size, seed, device)
    parallel = SequenceParallelTransformer(full)
    with CommLog() as forward_calls:
        logits = parallel(inputs)
        step_loss = loss(logits, targets)
    with CommLog() as backward_calls:
        step_loss.backward()
    sync_gradients(parallel)
    reference = full(inputs)
    loss(reference, targets).backward()
    x = full.embed(inputs).detach()
    return {"logits_error": float((logits - reference).detach().abs().max()),
            "grad_error": compare_gradients(parallel.model, full),
            "calls": {"forward": forward_calls.calls, "backward": backward_calls.calls},
            "saved_bytes": {"unsplit": saved_bytes(full.blocks[0], x),
                            "tensor parallel": saved_bytes(parallelize(full).blocks[0], x),
                            "sequence parallel": saved_bytes(parallel.model.blocks[0], _my_positions(x, None))}}
