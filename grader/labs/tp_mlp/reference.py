"""Lab: the tensor-parallel MLP (notebook 08). Check: course.labs.check("tp_mlp")."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


class CopyToTensorParallel(torch.autograd.Function):
    """f: forward, the identity; backward, sum the gradient over the ranks (dist.all_reduce)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: forward, sum the partial outputs over the ranks (dist.all_reduce); backward, the identity."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ParallelMLP(nn.Module):
    """fc2(gelu(fc1(x))) split over the ranks: fc1 column-parallel, fc2 row-parallel.

    Keep this rank's share as four parameters: w1, b1 = rows rank*k .. (rank+1)*k of fc1's weight and bias
    (k = d_ff / world_size); w2 = the same columns of fc2's weight; b2 = fc2's whole bias. Use exactly one
    all_reduce in forward and one in backward (through f and g), no other collective.
    """

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear):
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // world_size
        rows = slice(rank * k, (rank + 1) * k)
        self.w1 = nn.Parameter(fc1.weight.detach()[rows].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[rows].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, rows].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):  # x: (B, S, d), the same on every rank; returns (B, S, d), the same on every rank
        hidden = F.gelu(F.linear(CopyToTensorParallel.apply(x), self.w1, self.b1))  # (B, S, k): this rank's slice
        return ReduceFromTensorParallel.apply(F.linear(hidden, self.w2)) + self.b2


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/tp_mlp.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(16, 64).to(me.device), nn.Linear(64, 16).to(me.device)
    x = torch.randn(2, 4, 16, device=me.device)
    error = (ParallelMLP(fc1, fc2)(x) - fc2(F.gelu(fc1(x)))).abs().max().item()
    world.print0(f"ParallelMLP on {me.world_size} ranks differs from the unsplit MLP by {error:.2e}")
    world.shutdown()
