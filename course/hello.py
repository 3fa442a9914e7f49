"""Hello, world on N ranks: each rank reports who it is, then all-reduces a tensor and checks the sum.

Taught in ``notebooks/00_start_here.ipynb``; run it with ``launch(hello, world_size=4)``.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from course import world


def hello() -> dict[str, object]:
    """Run on every rank: all-reduce ``[rank + 1]`` and check it equals ``1 + 2 + ... + world_size``.

    Returns:
        This rank's report: rank, world size, backend, device, host, the reduced value and the expected one.

    Raises:
        RuntimeError: the all-reduced value is wrong (the collective is broken).
    """
    me = world.current()
    value = torch.tensor([float(me.rank + 1)], device=me.device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = me.world_size * (me.world_size + 1) / 2
    print(f"hello from rank {me.rank} of {me.world_size} on {me.device} ({me.backend}); "
          f"all_reduce gave {value.item():g}, expected {expected:g}")
    if value.item() != expected:
        raise RuntimeError(f"rank {me.rank}: all_reduce returned {value.item()}, expected {expected}.")
    return {"rank": me.rank, "world_size": me.world_size, "backend": me.backend, "device": str(me.device),
            "host": socket.gethostname(), "reduced": value.item(), "expected": expected}


def fail_on(bad_rank: int) -> int:
    """Run on every rank: rank ``bad_rank`` raises, the others wait in a barrier that can never complete.

    Shows what :func:`course.runtime.launch.launch` does when one rank fails: it names the rank, shows its traceback and
    stops the ranks left waiting for it.
    """
    me = world.current()
    if me.rank == bad_rank:
        raise RuntimeError(f"rank {me.rank} ran out of patience (a deliberate failure for notebook 00)")
    dist.barrier()
    return me.rank
