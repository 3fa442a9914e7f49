"""Lab: ring allreduce from point-to-point messages (notebook 04). Check: course.labs.check("ring")."""

import torch
import torch.distributed as dist

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


def ring_allreduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum (op="sum") or average (op="avg") `tensor` over every rank, in place, with a ring; return it.

    Use only dist.send/dist.recv or dist.isend/dist.irecv (no collective). `tensor` is 1-D, of any length
    (also shorter than the world size) and dtype (float32, float64, bfloat16).
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views: writing a chunk writes `tensor`
    for step in range(world_size - 1):  # reduce-scatter
        into = chunks[(rank - step - 1) % world_size]
        arrived = torch.empty_like(into)
        exchange(chunks[(rank - step) % world_size], arrived, right, left)
        into += arrived
    for step in range(world_size - 1):  # all-gather: chunk (rank + 1) is complete here
        exchange(chunks[(rank + 1 - step) % world_size], chunks[(rank - step) % world_size], right, left)
    if op == "avg":
        tensor /= world_size
    return tensor


def exchange(send: torch.Tensor, receive: torch.Tensor, right: int, left: int) -> None:
    """Send to the right while receiving from the left: every rank sends first, so the send must not block."""
    request = dist.isend(send, right)
    dist.recv(receive, left)
    request.wait()


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/ring_allreduce.py
    from course import world

    me = world.init_from_env()
    mine = torch.arange(10, dtype=torch.float32, device=me.device) * (me.rank + 1)
    ring_allreduce(mine)
    world.print0(f"ring_allreduce on {me.world_size} ranks: {mine.tolist()}")
    world.shutdown()
