"""A wrong FSDP lab (stretch goal): each prefetch's future is waited for as soon as it is issued, and the
handle waited again later: the data arrived before the layer before it computed, so nothing overlaps."""

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

    Stretch goal (the "prefetch" check): hide the gathers behind computation. Start the next layer's all-gather
    with ``async_op=True`` before computing the current layer, and ``wait()`` for it just before the next layer
    needs it; in backward, start the previous layer's gather (backward runs in reverse) before computing this
    layer's gradients. A gather's result is in its output tensor only once ``wait()`` returns. Prefetching holds
    two layers' full parameters at once: the one computing and the one arriving, never more.
    """

    def __init__(self, model: nn.Sequential) -> None:
        super().__init__()
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.steps, self.shards, self.shapes = [], nn.ParameterList(), []  # steps: modules, or a Linear's index
        self.arriving = {}  # layer index -> (its full flat parameters, the gather's work handle)
        for module in model:
            if not isinstance(module, nn.Linear):
                self.steps.append(module)
                continue
            flat = torch.cat([module.weight.detach().reshape(-1), module.bias.detach()])
            piece = -(-flat.numel() // self.world_size)  # ceil: the last piece is padded
            flat = F.pad(flat, (0, piece * self.world_size - flat.numel()))
            self.shards.append(nn.Parameter(flat[self.rank * piece:(self.rank + 1) * piece].clone()))
            self.shapes.append(tuple(module.weight.shape))
            self.steps.append(len(self.shards) - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            if isinstance(step, nn.Module):
                x = step(x)
                continue
            weight, bias = self.gathered(step)
            self.prefetch(step + 1)  # the next layer's gather runs while this layer computes
            x = GatheredLinear.apply(x, self.shards[step], weight, bias, self, step)
        return x

    def prefetch(self, index: int) -> None:
        """Start all-gathering layer ``index``'s pieces (if there is such a layer); :meth:`gathered` waits."""
        if 0 <= index < len(self.shards) and index not in self.arriving:
            shard = self.shards[index]
            full = torch.empty(shard.numel() * self.world_size, dtype=shard.dtype, device=shard.device)
            work = all_gather_single(full, shard.detach(), async_op=True)
            work.get_future().wait()  # waited for at once: nothing computes while it travels
            self.arriving[index] = full, work

    def gathered(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The full weight (out, in) and bias (out,) of layer ``index``, once its gather has arrived."""
        self.prefetch(index)  # not prefetched (the first layer of a pass): gather it now
        full, work = self.arriving.pop(index)
        work.wait()
        out_features, in_features = self.shapes[index]
        weight = full[:out_features * in_features].view(out_features, in_features)
        return weight, full[out_features * in_features:out_features * (in_features + 1)]


class GatheredLinear(torch.autograd.Function):
    """y = x W^T + b with W, b gathered in forward, freed, and gathered again in backward."""

    @staticmethod
    def forward(ctx, x, shard, weight, bias, fsdp, index):
        ctx.save_for_backward(x, shard)  # the input and the piece: never the full parameters
        ctx.fsdp, ctx.index = fsdp, index
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        weight, _ = ctx.fsdp.gathered(ctx.index)
        ctx.fsdp.prefetch(ctx.index - 1)  # backward runs in reverse: the previous layer is next
        grad_x = grad_y @ weight
        grad_full = torch.cat([(grad_y.T @ x).reshape(-1), grad_y.sum(dim=0)])
        world_size = dist.get_world_size()
        grad_full = F.pad(grad_full, (0, shard.numel() * world_size - grad_full.numel()))
        grad_shard = torch.empty_like(shard)
        reduce_scatter_single(grad_shard, grad_full)
        return grad_x, grad_shard / world_size, None, None, None, None

