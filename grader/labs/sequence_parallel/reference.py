"""Lab: sequence parallelism's gather linear (notebook 08). Check: course.labs.check("sequence_parallel")."""

import torch
import torch.distributed as dist
from torch.nn import functional as F

from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


def all_gather_sequence(x):
    """(B, S/t, d) on each of the t ranks -> (B, S, d): every rank's positions, in rank order.

    dist.all_gather_single (older torch: all_gather_into_tensor) stacks the ranks' tensors along dim 0: put
    the sequence first, then back.
    """
    shard = x.transpose(0, 1).contiguous()  # (S/t, B, d)
    whole = shard.new_empty((shard.shape[0] * dist.get_world_size(), *shard.shape[1:]))
    all_gather_single(whole, shard)
    return whole.transpose(0, 1)


def reduce_scatter_sequence(x):
    """(B, S, d) partial sums on each rank -> (B, S/t, d): this rank's positions, summed over the ranks.

    dist.reduce_scatter_single (older torch: reduce_scatter_tensor) cuts along dim 0: put the sequence first,
    then back.
    """
    whole = x.transpose(0, 1).contiguous()  # (S, B, d)
    mine = whole.new_empty((whole.shape[0] // dist.get_world_size(), *whole.shape[1:]))
    reduce_scatter_single(mine, whole)
    return mine.transpose(0, 1)


class GatherLinear(torch.autograd.Function):
    """A column-parallel linear whose input arrives cut along the sequence.

    forward(x, weight, bias): x is (B, S/t, d), this rank's positions; weight (k, d) and bias (k,) are this rank's
    rows of the whole linear. Gather x along the sequence, then return F.linear of it: (B, S, k).
    Save only the slice x for backward (not the gathered input): backward gathers it again.

    backward(grad): grad is (B, S, k). Return the gradients of x, weight and bias. Every rank's grad @ weight is a
    partial sum over its k columns; x needs the sum over the ranks, and only at its own positions.
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(all_gather_sequence(x), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        whole = all_gather_sequence(x)  # (B, S, d), gathered again rather than kept
        grad_x = reduce_scatter_sequence(grad @ weight)  # (B, S/t, d)
        grad_weight = grad.flatten(0, 1).T @ whole.flatten(0, 1)  # (k, d)
        return grad_x, grad_weight, grad.sum(dim=(0, 1))


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/sequence_parallel.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, 8, 16), torch.randn(32, 16), torch.randn(32)
    k, s = 32 // me.world_size, 8 // me.world_size
    rank = dist.get_rank()
    rows, positions = slice(rank * k, (rank + 1) * k), slice(rank * s, (rank + 1) * s)
    mine = GatherLinear.apply(x[:, positions].to(me.device), weight[rows].to(me.device), bias[rows].to(me.device))
    error = (mine.cpu() - F.linear(x, weight, bias)[..., rows]).abs().max().item()
    world.print0(f"GatherLinear on {me.world_size} ranks differs from the unsplit linear by {error:.2e}")
    world.shutdown()
