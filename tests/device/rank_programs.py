"""Rank functions that put a tensor on the CPU, or do not, for the device check's own tests."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import world


def reduce_on_the_cpu() -> float:
    value = torch.ones(3)  # the bug: no device
    dist.all_reduce(value)
    return value.sum().item()


def reduce_on_the_device() -> float:
    value = torch.ones(3, device=world.current().device)
    dist.all_reduce(value)
    return value.sum().item()


def mix_devices() -> torch.Tensor:
    return torch.ones(3, device=world.current().device) + torch.ones(3)


def ddp_on_the_cpu() -> None:
    DistributedDataParallel(nn.Linear(2, 2))


def ddp_on_the_device() -> float:
    device = world.current().device
    model = DistributedDataParallel(nn.Linear(2, 2).to(device))
    model(torch.ones(4, 2, device=device)).sum().backward()
    return float(model.module.weight.grad.norm())
