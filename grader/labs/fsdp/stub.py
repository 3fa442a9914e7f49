"""FSDP (ZeRO-3) by hand: each rank keeps 1/world_size of every layer's parameters, gathered only while used.

Training with it (what the check does, on every rank):

    model = MyFSDP(nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), ..., nn.Linear(32, 12)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)   # the local shards only
    for images, labels in batches:              # every rank starts from the same parameters
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()  # gathers, frees, reduce-scatters the gradients
        optimizer.step()                           # each rank steps its own shards

Run it on 4 ranks from a terminal: torchrun --nproc_per_node=4 labs/fsdp.py
"""

import torch
import torch.distributed as dist  # noqa: F401 - you will need it
from torch import nn
from torch.nn import functional as F  # noqa: F401 - you will need it

STUDENT_ID = ""  # your student id (the one you log in with): the check draws your own variant from it


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
        raise NotImplementedError("write MyFSDP.__init__: cut each Linear's parameters into pieces, keep yours")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("write MyFSDP.forward: gather each layer, compute it, let it go (and backward)")


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/fsdp.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(0)  # the same model on every rank
    model = MyFSDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + me.rank)  # each rank its own data
    for _step in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
    kept = sum(p.numel() for p in model.parameters())
    print(f"rank {me.rank}: keeps {kept} of the model's parameters")
    world.shutdown()
