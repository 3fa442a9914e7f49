"""DDP by hand: keep N model replicas identical, overlapping the gradient allreduce with backward.

Training with it (what the check does, on every rank):

    model = MyDDP(model, bucket_cap_bytes)
    for images, labels in batches:
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()   # your hooks launch allreduces while this runs
        model.finish_gradient_synchronization()     # wait for them; every .grad now holds the average
        optimizer.step()

Run it on 4 ranks from a terminal: torchrun --nproc_per_node=4 labs/ddp_by_hand.py
"""

import torch
import torch.distributed as dist
from torch import nn

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


class MyDDP(nn.Module):
    """Wraps ``module`` (kept as ``self.module`` and trained in place) for data-parallel training.

    1. At the start, every rank takes rank 0's parameters (``dist.broadcast``).
    2. Each parameter gets a ``register_post_accumulate_grad_hook``: autograd calls it as soon as that
       parameter's ``.grad`` is ready, while backward goes on computing the earlier layers' gradients.
    3. Gradients are packed, in the order they become ready (the reverse of ``module.parameters()``), into
       buckets of at most ``bucket_cap_bytes`` bytes: a bucket is closed before the gradient that would overflow
       it, and a gradient bigger than a bucket gets one of its own (like ``my_assign_buckets`` in notebook 04b).
    4. When a bucket is full, its gradients are flattened into one tensor and ONE
       ``dist.all_reduce(..., async_op=True)`` is launched at once, from the hook: do not wait for it there.
       Buckets are launched in order, 0, 1, 2, ...: collectives are matched by order, so every rank must launch
       the same bucket first. A bucket that fills before an earlier one waits until that one is launched.
    5. ``finish_gradient_synchronization()`` waits for every launched allreduce, divides by the world size
       (average, not sum) and copies each bucket's slice back into its parameters' ``.grad``.
    """

    def __init__(self, module: nn.Module, bucket_cap_bytes: int) -> None:
        super().__init__()
        self.module = module
        self.bucket_cap_bytes = bucket_cap_bytes
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        params = [p for p in module.parameters() if p.requires_grad][::-1]  # the order gradients become ready
        self.buckets, filled = [], 0
        for p in params:
            size = p.numel() * p.element_size()
            if not self.buckets or filled + size > bucket_cap_bytes:
                self.buckets.append([])
                filled = 0
            self.buckets[-1].append(p)
            filled += size
        self.bucket_of = {p: index for index, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.launched = 0  # buckets 0 .. launched-1 are in flight
        self.in_flight = []  # (work, flat gradients, bucket)
        for p in params:
            p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _gradient_ready(self, p: torch.Tensor) -> None:
        self.ready[self.bucket_of[p]] += 1
        while self.launched < len(self.buckets) and self.ready[self.launched] == len(self.buckets[self.launched]):
            self._launch_next()  # the next bucket in order is full: launch it (and any full ones after it)

    def _launch_next(self) -> None:
        bucket = self.buckets[self.launched]
        self.launched += 1
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
        self.in_flight.append((dist.all_reduce(flat, async_op=True), flat, bucket))

    def finish_gradient_synchronization(self) -> None:
        while self.launched < len(self.buckets):  # some parameter got no gradient this step
            self._launch_next()
        for work, flat, bucket in self.in_flight:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for p in bucket:
                p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        self.in_flight, self.ready, self.launched = [], [0] * len(self.buckets), 0


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/ddp_by_hand.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(me.rank)  # different on every rank: MyDDP must broadcast rank 0's parameters
    model = MyDDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(me.device), bucket_cap_bytes=256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8, device=me.device)).pow(2).mean().backward()
        model.finish_gradient_synchronization()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    world.print0(f"after 3 steps rank 0's parameters sum to {flat.sum():.6f}")
    print(f"rank {me.rank}: parameters sum to {flat.sum():.6f} (every rank should print the same)")
    world.shutdown()
