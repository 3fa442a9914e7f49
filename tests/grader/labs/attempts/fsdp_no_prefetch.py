"""An FSDP lab without the stretch goal: every all-gather blocks, so no gather overlaps a layer's computation."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older


class MyFSDP(nn.Module):
    """Wraps ``model``, an ``nn.Sequential`` of ``nn.Linear`` layers and parameter-free layers (ReLU, Flatten).

    The layout (the check gathers your shards with it): for each ``nn.Linear``, its weight and bias flattened
    and concatenated (weight first), padded with zeros to a multiple of world_size, and cut into world_size
    equal pieces; rank r keeps piece r as one ``nn.Parameter`` in ``self.shards`` (an ``nn.ParameterList``, one
    per Linear, in order). ``self.shards`` are MyFSDP's only parameters.

    1. Forward, layer by layer: all-gather the layer's pieces (``dist.all_gather_single``) into its full
       weight and bias, compute the layer, and let the full parameters go: keep no reference to them.
    2. Backward, layer by layer from the last: all-gather the layer's parameters again, compute the gradients
       of its input, weight and bias, and ``dist.reduce_scatter_single`` the flattened (padded) weight and bias
       gradients: this rank receives the SUM of its piece's gradient over the ranks; divide by world_size.
       That is its shard's ``.grad``. A ``torch.autograd.Function`` per layer does both passes.
    3. The optimizer steps the shards; nothing else is needed.
    """

    def __init__(self, model: nn.Sequential) -> None:
        super().__init__()
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.steps, self.shards = [], nn.ParameterList()  # steps: ("layer", module) or ("linear", shapes)
        for module in model:
            if not isinstance(module, nn.Linear):
                self.steps.append(("layer", module))
                continue
            flat = torch.cat([module.weight.detach().reshape(-1), module.bias.detach()])
            piece = -(-flat.numel() // self.world_size)  # ceil: the last piece is padded
            flat = F.pad(flat, (0, piece * self.world_size - flat.numel()))
            self.shards.append(nn.Parameter(flat[self.rank * piece:(self.rank + 1) * piece].clone()))
            self.steps.append(("linear", (tuple(module.weight.shape), len(self.shards) - 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for kind, what in self.steps:
            if kind == "layer":
                x = what(x)
            else:
                shape, index = what
                x = GatheredLinear.apply(x, self.shards[index], shape)
        return x


def gather(shard: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The full weight (out, in) and bias (out,) of one layer, all-gathered from every rank's piece."""
    full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype, device=shard.device)
    all_gather_single(full, shard.detach())
    out_features, in_features = shape
    weight = full[:out_features * in_features].view(out_features, in_features)
    return weight, full[out_features * in_features:out_features * (in_features + 1)]


class GatheredLinear(torch.autograd.Function):
    """y = x W^T + b with W, b gathered in forward, freed, and gathered again in backward."""

    @staticmethod
    def forward(ctx, x, shard, shape):
        weight, bias = gather(shard, shape)
        ctx.save_for_backward(x, shard)  # the input and the piece: never the full parameters
        ctx.shape = shape
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        weight, _ = gather(shard, ctx.shape)
        grad_x = grad_y @ weight
        grad_full = torch.cat([(grad_y.T @ x).reshape(-1), grad_y.sum(dim=0)])
        world_size = dist.get_world_size()
        grad_full = F.pad(grad_full, (0, shard.numel() * world_size - grad_full.numel()))
        grad_shard = torch.empty_like(shard)
        reduce_scatter_single(grad_shard, grad_full)
        return grad_x, grad_shard / world_size, None

