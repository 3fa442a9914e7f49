"""A wrong ring lab: the right sums and bytes, but every rank sends each chunk straight to its owner (no ring)."""

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum (op="sum") or average (op="avg") `tensor` over every rank, in place, with a ring; return it."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), world_size)
    others = [peer for peer in range(world_size) if peer != rank]
    # reduce-scatter: chunk j goes straight to rank j, which adds what every other rank sent
    arrived = {peer: torch.empty_like(chunks[rank]) for peer in others}
    requests = [dist.isend(chunks[peer].clone(), peer) for peer in others]
    requests += [dist.irecv(arrived[peer], peer) for peer in others]
    for request in requests:
        request.wait()
    for peer in others:
        chunks[rank].add_(arrived[peer])
    # all-gather: each rank sends its reduced chunk to every other rank
    requests = [dist.isend(chunks[rank], peer) for peer in others]
    requests += [dist.irecv(chunks[peer], peer) for peer in others]
    for request in requests:
        request.wait()
    if op == "avg":
        tensor /= world_size
    return tensor
