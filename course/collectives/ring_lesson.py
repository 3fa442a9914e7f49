"""The ring allreduce as a lesson: reduce-scatter, then all-gather, with the index arithmetic in view.

What notebook 04 shows first. Rank r sends to its right neighbour (r + 1) and receives from its left (r - 1),
one chunk (1/n of the tensor) per step. In reduce-scatter step s, rank r passes on chunk (r - s) and adds what
arrives into chunk (r - s - 1); after n - 1 steps rank r holds chunk (r + 1) summed over every rank. All-gather
then passes the finished chunks around the same ring for n - 1 more steps. Every rank sends 2 (n - 1) / n of
the tensor, whatever n: the algorithm is bandwidth-optimal. No checks, no pipelining: the production version
(:func:`course.collectives.allreduce.ring_allreduce`: an agreement check that every rank called the same thing, NaN
stand-ins, lock-step batches on NCCL) adds only what a library must; tests hold both to ``dist.all_reduce``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course import world


def ring_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, around a ring (every rank must call it, same shape and dtype)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).tensor_split(n))  # views: writing a chunk writes the tensor
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):  # reduce-scatter
        send, receive = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[receive])
        exchange(chunks[send], right, incoming, left)
        chunks[receive] += incoming
    for step in range(n - 1):  # all-gather: rank r now owns chunk r + 1
        send, receive = (rank - step + 1) % n, (rank - step) % n
        exchange(chunks[send], right, chunks[receive], left)
    return tensor


def exchange(outgoing: torch.Tensor, to: int, incoming: torch.Tensor, source: int) -> None:
    """Send ``outgoing`` to rank ``to`` while receiving ``incoming`` from rank ``source`` (both at once, or a
    ring of blocking sends would wait on itself)."""
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing.contiguous(), to),
                                       dist.P2POp(dist.irecv, incoming, source)])
    for request in requests:
        request.wait()


def largest_difference(sizes: tuple[int, ...] = (1, 3, 17, 100_003), seed: int = 0) -> float:
    """Run on every rank: :func:`ring_allreduce` and ``dist.all_reduce`` on the same random float64 tensors of
    each size; returns the largest element-wise difference (float64 rounding: the two add in different orders)."""
    rank, worst = dist.get_rank(), 0.0
    for numel in sizes:
        data = torch.randn(numel, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + rank + numel))
        data = data.to(world.current().device)  # drawn on the CPU (the same numbers everywhere), reduced on the device
        expected = data.clone()
        dist.all_reduce(expected)
        worst = max(worst, (ring_allreduce(data) - expected).abs().max().item())
    return worst
