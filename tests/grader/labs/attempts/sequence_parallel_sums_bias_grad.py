"""Wrong: backward sums the bias gradient over the ranks too, though each rank's rows of the bias are its own."""

import torch
import torch.distributed as dist
from torch.nn import functional as F

from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older


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
        grad_bias = grad.sum(dim=(0, 1)).contiguous()
        dist.all_reduce(grad_bias)  # wrong: every rank's rows of the bias are its own, already whole
        return grad_x, grad_weight, grad_bias
