"""Rank functions for tests/ddp/test_distributed_optimizer.py and tests/ddp/test_horovod.py (importable, as launch()
requires): every 2-rank check in ONE launch (starting ranks is slow).

``report()`` launches once per test session and caches the per-rank results, so both test modules share it.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn

from course import world
from course.ddp import distributed_optimizer as do
from course.ddp import horovod, overlap
from course.runtime.launch import launch

WORLD_SIZE = 2


class SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: backward then lasts long enough to see communication overlap it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(1.0)
        return grad


class SlowFirstLayer(nn.Module):
    """Three linear layers; backward through the first is slow, so the last layers' buckets are ready early."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.middle, self.last = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.middle(SlowBackward.apply(torch.relu(self.first(x))))))


def overlap_times(bucket_bytes: int = 1) -> dict[str, float]:
    """When the first bucket's allreduce ran, relative to when loss.backward() returned."""
    torch.manual_seed(0)
    model = SlowFirstLayer()
    optimizer = do.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                        bucket_bytes=bucket_bytes, record_events=True)
    try:
        model(torch.randn(4, 8)).sum().backward()
        backward_end = time.perf_counter()
        optimizer.step()
    finally:
        optimizer.close()
    first = next(e for e in optimizer.events if e.kind == "allreduce")
    last = [e for e in optimizer.events if e.kind == "allreduce"][-1]
    last_grad = max(e.start for e in optimizer.events if e.kind == "grad")
    return {"first_start": first.start - backward_end, "first_end": first.end - backward_end,
            "last_start": last.start - backward_end, "last_end": last.end - backward_end,
            "last_grad": last_grad - backward_end, "buckets": len(optimizer.buckets)}


def disagreements() -> dict[str, str]:
    """The construction error on this rank when rank 1 builds a different model, or passes a different op or
    algorithm (steps then run with check=False, so this one-time check is all that stands before a hang)."""
    me = world.current()
    messages = {}
    for what in ("model", "op", "algorithm"):
        model = nn.Linear(3, 4 if (what == "model" and me.rank == 1) else 2)
        op = "sum" if (what == "op" and me.rank == 1) else "avg"
        algorithm = "tree" if (what == "algorithm" and me.rank == 1) else "ring"
        try:
            do.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), op=op,
                                    algorithm=algorithm)
        except ValueError as error:
            messages[what] = str(error)
    return messages


def everything() -> dict[str, object]:
    """broadcast_parameters, broadcast_optimizer_state and allreduce_metric, the optimizer's overlap and
    construction check, the whole Horovod recipe, and overlap.record_steps, seen from one rank."""
    me = world.current()
    torch.manual_seed(me.rank)  # a different model on every rank ...
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    model[1].running_mean.fill_(float(me.rank))
    horovod.broadcast_parameters(model.state_dict(), root_rank=1)  # ... until rank 1's wins
    # Plain lists: tensors sent back through launch()'s queue die with the rank's process.
    weight, running_mean = model[0].weight.tolist(), model[1].running_mean.tolist()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (me.rank + 1), momentum=0.9)
    if me.rank == 1:  # only the root has momentum buffers, as after resuming from its checkpoint
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
    horovod.broadcast_optimizer_state(optimizer, root_rank=1)
    momentum = optimizer.state[model[0].weight]["momentum_buffer"]
    return {
        "weight": weight,
        "running_mean": running_mean,
        "lr": optimizer.param_groups[0]["lr"],
        "momentum": momentum.tolist(),
        "avg": horovod.allreduce_metric(float(me.rank)),
        "sum": horovod.allreduce_metric(me.rank, op="sum"),
        "tensor": horovod.allreduce_metric(torch.tensor([1.0, me.rank]), op="sum").tolist(),
        "overlap": overlap_times(),
        "disagreements": disagreements(),
        "recipe": horovod.recipe(steps=3),
        "steps": overlap.record_steps([1024, 1 << 30], batch_size=8, steps=2, warmup_steps=1),
    }


@functools.cache
def report() -> list[dict[str, Any]]:
    """Per-rank results of :func:`everything`, launched once."""
    return launch(everything, WORLD_SIZE, timeout_s=180)
