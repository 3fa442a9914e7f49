"""Bytes of the real tensors training keeps: parameters, ``.grad`` and optimizer state, summed after a real step.

The measured side of :mod:`course.memory.budget`: every figure is ``numel() x element_size()`` of tensors that
exist, counted on this rank (a sharded tensor counts its local shard only). Mixed precision is the ZeRO paper's
scheme done by hand: the model in 16 bits, its fp32 master copy inside the optimizer. Taught in
``notebooks/07_memory.ipynb``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from course import train
from course.memory.budget import Budget

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the tensors on this rank; a DTensor (FSDP's sharded parameter) counts its local shard."""
    total = 0
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            total += local.numel() * local.element_size()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, model: nn.Module | None = None) -> int:
    """Bytes of ``optimizer.state`` tensors, plus the parameters it updates that are not ``model``'s (fp32 masters)."""
    state = tensor_bytes(value for per_param in optimizer.state.values() for value in per_param.values())
    own = {id(p) for p in model.parameters()} if model is not None else set()
    masters = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in own]
    return state + (tensor_bytes(masters) if model is not None else 0)


def measure(model: nn.Module, optimizer: torch.optim.Optimizer) -> Budget:
    """Measured model states on this rank: parameter, gradient and optimizer-state bytes (no activations)."""
    params = list(model.parameters())
    return Budget(tensor_bytes(params), tensor_bytes(p.grad for p in params), optimizer_state_bytes(optimizer, model))


def fp32_step(model: nn.Module, optimizer_name: str, inputs: torch.Tensor, labels: torch.Tensor) -> Budget:
    """One real fp32 training step of ``model``, then its measured model states (gradients kept, as after backward)."""
    optimizer = train.make_optimizer(optimizer_name, model.parameters())
    nn.functional.cross_entropy(model(inputs), labels).backward()
    optimizer.step()
    return measure(model, optimizer)


def mixed_precision_step(model: nn.Module, optimizer_name: str, inputs: torch.Tensor, labels: torch.Tensor,
                         precision: str = "bf16") -> Budget:
    """One real mixed-precision step: 16-bit model and gradients, fp32 master weights updated by the optimizer.

    The scheme of Micikevicius et al. 2018 (https://arxiv.org/abs/1710.03740) that ZeRO's 2 + 2 + K counts:
    forward and backward in 16 bits, each gradient upcast to its master, the fp32 step, the masters copied back.
    ``model`` is converted in place.
    """
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {sorted(DTYPES)}, got {precision!r}.")
    model.to(DTYPES[precision])
    masters = [p.detach().float() for p in model.parameters()]
    optimizer = train.make_optimizer(optimizer_name, masters)
    nn.functional.cross_entropy(model(inputs.to(DTYPES[precision])), labels).backward()
    for master, param in zip(masters, model.parameters(), strict=True):
        master.grad = param.grad.float()  # one tensor at a time on a GPU; freed right after the step
    optimizer.step()
    with torch.no_grad():
        for master, param in zip(masters, model.parameters(), strict=True):
            master.grad = None
            param.copy_(master)
    return measure(model, optimizer)
