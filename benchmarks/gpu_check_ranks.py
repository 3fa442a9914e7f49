"""Rank functions for benchmarks/gpu_check.py (importable: ``course.runtime.launch`` starts each rank afresh).

The same code runs on real GPUs (``course.world`` picks nccl and ``cuda:<local_rank>``) and on emulated ranks.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import world
from course.memory.resnet import resnet50
from course.models import DigitsCNN


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model(name: str) -> tuple[nn.Module, tuple[int, ...], int]:
    """The course model ``name`` with its input shape and class count."""
    if name == "DigitsCNN":
        return DigitsCNN(1), (1, 8, 8), 10
    if name == "ResNet-50":
        return resnet50(), (3, 224, 224), 1000
    raise ValueError(f"model must be 'DigitsCNN' or 'ResNet-50', got {name!r}.")


def ddp_step_seconds(name: str, batch_size: int, steps: int, autocast: bool) -> float:
    """Median seconds of one DDP training step (forward, backward with its bucketed allreduces, SGD update)
    of the course model ``name`` with per-rank ``batch_size``, after two warm-up steps; the slowest rank's."""
    rank = world.current()
    model, shape, classes = _model(name)
    model = model.to(rank.device)
    ddp = DistributedDataParallel(model, device_ids=[rank.device] if rank.device.type == "cuda" else None) \
        if rank.world_size > 1 else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, *shape, device=rank.device)
    y = torch.randint(0, classes, (batch_size,), device=rank.device)
    times = []
    for step in range(steps + 2):
        _synchronize(rank.device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(rank.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        _synchronize(rank.device)
        if step >= 2:
            times.append(time.perf_counter() - start)
    median = torch.tensor(sorted(times)[len(times) // 2], dtype=torch.float64, device=rank.device)
    if rank.world_size > 1:
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return float(median)


def allreduce_seconds(sizes: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of ``dist.all_reduce`` of float32 tensors of each size (bytes), the slowest rank's."""
    rank = world.current()
    result = {}
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4, device=rank.device)
        dist.all_reduce(tensor)  # warm-up: connections, buffers
        times = []
        for _ in range(repeats):
            _synchronize(rank.device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _synchronize(rank.device)
            times.append(time.perf_counter() - start)
        median = torch.tensor(sorted(times)[len(times) // 2], dtype=torch.float64, device=rank.device)
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        result[nbytes] = float(median)
    return result
