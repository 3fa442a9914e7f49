"""Tensor parallelism (Megatron-LM): one layer's weight matrices split across the ranks of a group.

A **column-parallel** linear keeps rows ``r·k .. (r+1)·k`` of the weight (a slice of the output features): every rank
needs the whole input and produces its slice of the output. A **row-parallel** linear keeps the matching columns
(a slice of the input features): it takes the slice, and its outputs are partial sums that must be added up.
Putting a column-parallel linear first and a row-parallel one second makes the MLP need just two
communication operators, conjugate to each other (Megatron's *f* and *g*)::

    f: forward identity,   backward all-reduce    (every rank's slice contributed to the input's gradient)
    g: forward all-reduce, backward identity      (the output is the sum of the partial outputs)

    MLP:       y = g( gelu( f(x) · W1_r^T ) · W2_r^T ) + b2          one all-reduce forward, one backward
    attention: y = g( attend_heads_r( f(x) · Wqkv_r^T ) · Wo_r^T ) + bo   rank r owns num_heads / t heads

The nonlinearity (gelu, or attention per head) runs on the slice without communicating: that is why the
column-then-row order is chosen. :func:`parallelize` turns a ``transformer.Transformer`` into this rank's
tensor-parallel copy; :func:`local_slice` cuts any full-model tensor (a gradient, say) the way this rank holds it,
so outputs and gradients can be compared with the unsplit model. Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from course import world
from course.model_parallel.transformer import MLP, Attention, Transformer, attend, build, loss, sample_batch
from course.model_parallel.transformer import Config as TransformerConfig
from course.runtime.comm_log import CommLog

Communication = Callable[[torch.Tensor, "dist.ProcessGroup | None"], torch.Tensor]


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's *f*: identity forward; backward, sum the input's gradient over the group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:  # noqa: ANN001
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's *g*: forward, sum the partial outputs over the group; backward, identity."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:  # noqa: ANN001
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        return grad, None


def copy_to_tensor_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """*f* on ``x`` (see :class:`CopyToTensorParallel`)."""
    return CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """*g* on ``x`` (see :class:`ReduceFromTensorParallel`)."""
    return ReduceFromTensorParallel.apply(x, group)


def _shard_index(size: int, rank: int, world_size: int, blocks: int = 1) -> torch.Tensor:
    """Indices of rank's share of ``size`` features cut into ``blocks`` equal blocks (``[q|k|v]``: 3), each
    split in ``world_size`` slices.

    Raises:
        ValueError: a block that does not split evenly.
    """
    block = size // blocks
    if size % blocks or block % world_size:
        raise ValueError(f"{size} features ({blocks} block(s) of {block}) do not split evenly over {world_size} "
                         "ranks: pick a tensor-parallel size that divides the heads and the MLP width.")
    width = block // world_size
    return torch.cat([torch.arange(b * block + rank * width, b * block + (rank + 1) * width) for b in range(blocks)])


class ColumnParallelLinear(nn.Module):
    """This rank's rows of ``full`` (output features ``index``): ``y_r = enter(x) · W_r^T + b_r``.

    Args:
        full: the unsplit ``nn.Linear``; its weights are copied, not shared.
        blocks: output blocks split separately (3 for a ``[q | k | v]`` projection).
        enter: the communication on the input: *f* (tensor parallelism) or an all-gather (sequence parallelism).
    """

    def __init__(self, full: nn.Linear, group: dist.ProcessGroup | None = None, blocks: int = 1,
                 enter: Communication = copy_to_tensor_parallel) -> None:
        super().__init__()
        self.group, self.enter = group, enter
        self.index = _shard_index(full.out_features, dist.get_rank(group), dist.get_world_size(group), blocks)
        self.weight = nn.Parameter(full.weight.detach()[self.index].clone())
        self.bias = nn.Parameter(full.bias.detach()[self.index].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.enter(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's columns of ``full`` (input features ``index``): ``y = leave(x_r · W_r^T) + b``, bias whole.

    Args:
        leave: the communication on the partial output: *g* (an all-reduce) or a reduce-scatter (sequence
            parallelism).
    """

    def __init__(self, full: nn.Linear, group: dist.ProcessGroup | None = None,
                 leave: Communication = reduce_from_tensor_parallel) -> None:
        super().__init__()
        self.group, self.leave = group, leave
        self.index = _shard_index(full.in_features, dist.get_rank(group), dist.get_world_size(group))
        self.weight = nn.Parameter(full.weight.detach()[:, self.index].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())  # added once, after the partial sums are added up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.leave(F.linear(x, self.weight), self.group) + self.bias


class ParallelMLP(nn.Module):
    """The MLP split: column-parallel ``fc1`` (*f* on its input), gelu on the slice, row-parallel ``fc2`` (*g*).

    Args:
        column, leave: the column-parallel class and the row-parallel output's communication (sequence
            parallelism passes its own).
    """

    def __init__(self, mlp: MLP, group: dist.ProcessGroup | None = None,
                 column: type[ColumnParallelLinear] = ColumnParallelLinear,
                 leave: Communication = reduce_from_tensor_parallel) -> None:
        super().__init__()
        self.fc1 = column(mlp.fc1, group)
        self.fc2 = RowParallelLinear(mlp.fc2, group, leave=leave)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelAttention(nn.Module):
    """Attention split by heads: this rank's q, k and v rows (``num_heads / t`` heads), its columns of ``proj``.

    Raises:
        ValueError: a number of heads the group does not divide.
    """

    def __init__(self, attention: Attention, group: dist.ProcessGroup | None = None,
                 column: type[ColumnParallelLinear] = ColumnParallelLinear,
                 leave: Communication = reduce_from_tensor_parallel) -> None:
        super().__init__()
        world_size = dist.get_world_size(group)
        if attention.num_heads % world_size:
            raise ValueError(f"{attention.num_heads} heads do not split over {world_size} ranks: use a "
                             "tensor-parallel size that divides num_heads.")
        self.num_heads = attention.num_heads // world_size
        self.qkv = column(attention.qkv, group, blocks=3)
        self.proj = RowParallelLinear(attention.proj, group, leave=leave)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(attend(self.qkv(x), self.num_heads))


def parallelize(model: Transformer, group: dist.ProcessGroup | None = None) -> Transformer:
    """This rank's tensor-parallel copy of ``model``: every block's attention and MLP split over ``group``;
    embeddings, norms and the output head stay whole (replicated) on every rank. ``model`` is left as it was."""
    model = copy.deepcopy(model)
    for block in model.blocks:
        block.attention = ParallelAttention(block.attention, group)
        block.mlp = ParallelMLP(block.mlp, group)
    return model


def local_slice(model: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` (a tensor of the unsplit model's parameter ``name``: its value or its gradient) that
    this rank's ``model`` holds as its parameter ``name``."""
    module_name, _, kind = name.rpartition(".")
    module = model.get_submodule(module_name)
    if isinstance(module, ColumnParallelLinear):
        return full[module.index]
    if isinstance(module, RowParallelLinear) and kind == "weight":
        return full[:, module.index]
    return full


def compare_gradients(parallel: nn.Module, full: nn.Module) -> dict[str, float]:
    """``{parameter name: largest |difference|}`` between this rank's gradients and its slice of the unsplit
    model's gradients (both after a backward pass)."""
    reference = dict(full.named_parameters())
    return {name: float((p.grad - local_slice(parallel, name, reference[name].grad)).abs().max())
            for name, p in parallel.named_parameters()}


#: All-reduces one transformer block makes per training step, per direction: attention's and the MLP's *g* forward,
#: their *f* backward.
ALLREDUCES_PER_LAYER = {"forward": 2, "backward": 2}


def allreduce_bytes_per_layer(batch_size: int, seq_len: int, d_model: int, element_bytes: int = 4) -> int:
    """Bytes of activations all-reduced per block per step (forward and backward): 4 tensors of ``B·S·d``."""
    return sum(ALLREDUCES_PER_LAYER.values()) * batch_size * seq_len * d_model * element_bytes


def step_on_rank(config: TransformerConfig, batch_size: int = 8, seed: int = 0) -> dict:
    """Run inside a launched rank: one forward and backward of the tensor-parallel transformer over the whole
    world, beside the unsplit model on the same batch, counting the collectives.

    Returns:
        ``{"logits_error": largest |difference| of the logits, "grad_error": {name: largest |difference|},
        "calls": {"forward": [Call], "backward": [Call]}}`` for this rank.
    """
    device = world.current().device
    full = build(config, seed, device)
    inputs, targets = sample_batch(config, batch_size, seed, device)
    parallel = parallelize(full)
    with CommLog() as forward_calls:
        logits = parallel(inputs)
        step_loss = loss(logits, targets)
    with CommLog() as backward_calls:
        step_loss.backward()
    reference = full(inputs)
    loss(reference, targets).backward()
    return {"logits_error": float((logits - reference).detach().abs().max()),
            "grad_error": compare_gradients(parallel, full),
            "calls": {"forward": forward_calls.calls, "backward": backward_calls.calls}}
