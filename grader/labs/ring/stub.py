"""Lab: ring allreduce from point-to-point messages (notebook 04). Check: course.labs.check("ring")."""

import torch
import torch.distributed as dist

STUDENT_ID = ""  # your student id (the one you log in with): the check draws your own variant from it


def ring_allreduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Sum (op="sum") or average (op="avg") `tensor` over every rank, in place, with a ring; return it.

    Use only dist.send/dist.recv or dist.isend/dist.irecv (no collective). `tensor` is 1-D, of any length
    (also shorter than the world size) and dtype (float32, float64, bfloat16).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views: writing a chunk writes `tensor`
    # 1. Reduce-scatter, n-1 steps: at step s send chunk (rank - s) to the right, receive the left's chunk
    #    (rank - s - 1) into a buffer and add it into yours. Then chunk (rank + 1) holds the full sum.
    raise NotImplementedError("write the reduce-scatter")
    # 2. All-gather, n-1 steps: at step s send chunk (rank + 1 - s), receive chunk (rank - s) into its place.
    raise NotImplementedError("write the all-gather")
    # 3. op="avg": divide by world_size.
    return tensor


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/ring_allreduce.py
    from course import world

    me = world.init_from_env()
    mine = torch.arange(10, dtype=torch.float32, device=me.device) * (me.rank + 1)
    ring_allreduce(mine)
    world.print0(f"ring_allreduce on {me.world_size} ranks: {mine.tolist()}")
    world.shutdown()
