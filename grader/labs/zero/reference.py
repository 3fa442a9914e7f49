"""ZeRO-1: Adam whose state is split over the ranks, so each rank keeps 1/world_size of it.

Training with it (what the check does, on every rank; no DDP: the optimizer synchronises the gradients):

    optimizer = MyZeRO1Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-3)
    for images, labels in batches:              # every rank starts from the same parameters
        model.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()  # this rank's gradients only
        optimizer.step()                           # reduce-scatter, Adam on my shard, all-gather

Run it on 4 ranks from a terminal: torchrun --nproc_per_node=4 labs/zero1_adam.py
"""

import torch
import torch.distributed as dist  # noqa: F401 - you will need it

from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


class MyZeRO1Adam:
    """Adam (``torch.optim.Adam``'s update, no weight decay) with its state sharded over the ranks.

    Think of all the parameters flattened into one vector of Ψ elements, padded to a multiple of world_size and
    cut into world_size equal shards: rank r owns shard r. In ``step()``:

    1. Flatten every parameter's ``.grad`` into one padded vector and ``dist.reduce_scatter_single`` it (older
       torch: ``reduce_scatter_tensor``): this rank receives the SUM of its shard over the ranks;
       divide by the world size (average).
    2. Adam on this rank's shard only: ``exp_avg`` and ``exp_avg_sq`` exist for the shard alone (that is the
       memory ZeRO-1 saves); step counter t from 1, bias corrections ``1 - beta**t``, ``eps`` after the sqrt:
       p -= lr * (m / (1 - beta1**t)) / (sqrt(v / (1 - beta2**t)) + eps).
    3. ``dist.all_gather_single`` (older torch: ``all_gather_into_tensor``) the updated shards, so every
       rank has every updated parameter, and copy them back into the parameters.

    Keep on ``self`` only your shard's state between steps; buffers for the whole gradient belong inside step().
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.shard = -(-numel // self.world_size)  # ceil: the last shard is padded
        like = self.params[0]
        self.exp_avg = torch.zeros(self.shard, dtype=like.dtype, device=like.device)
        self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        self.t = 0

    def _flat(self, tensors) -> torch.Tensor:
        """The tensors flattened into one vector padded with zeros to world_size * shard elements."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.world_size * self.shard - flat.numel()))

    @torch.no_grad()
    def step(self) -> None:
        grads = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        grad = torch.empty_like(self.exp_avg)
        reduce_scatter_single(grad, grads)
        grad /= self.world_size
        mine = self._flat(self.params)[self.rank * self.shard:(self.rank + 1) * self.shard]
        self.t += 1
        beta1, beta2 = self.betas
        self.exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (self.exp_avg_sq / (1 - beta2 ** self.t)).sqrt_().add_(self.eps)
        mine -= self.lr * (self.exp_avg / (1 - beta1 ** self.t)) / denominator
        everything = torch.empty(self.world_size * self.shard, dtype=mine.dtype, device=mine.device)
        all_gather_single(everything, mine)
        offset = 0
        for p in self.params:
            p.copy_(everything[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/zero1_adam.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(0)  # the same model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).to(me.device)
    optimizer = MyZeRO1Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + me.rank)  # each rank its own data
    for _step in range(3):
        model.zero_grad(set_to_none=True)
        model(torch.randn(4, 7, device=me.device)).pow(2).mean().backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(f"rank {me.rank}: parameters sum to {flat.sum():.6f} (every rank should print the same)")
    world.shutdown()
