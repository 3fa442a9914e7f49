"""Allreduce through shared memory: the link inside a node that is faster than sockets.

On one host, NCCL does not send a GPU's data over TCP to the GPU next to it: it copies through NVLink or
through a buffer in shared memory. This is the second, on emulated GPUs (CPU processes): every rank of the
group maps the same file in ``/dev/shm`` (one *slot* per rank, plus a *result*), and::

    1. rank r copies its tensor into slot r, all but chunk r            # (n-1)/n of N bytes written
    2. barrier                                                          # every slot is full
    3. rank r adds its own chunk r (straight from its tensor) and       # reduce-scatter, no messages
       chunk r of every other slot into chunk r of the result
    4. barrier                                                          # every chunk of the result is final
    5. rank r copies the whole result into its tensor                   # all-gather, one read of N bytes

No byte goes through a socket, and no message is sent: a barrier is a counter per rank in the same shared
memory (``course.collectives.shm_group`` maps the file and keeps the barrier), and a waiting rank sleeps on it (a futex)
rather than spin. Each rank copies ``(n-1)/n·N`` bytes in and ``N`` out and reads ``n`` chunks of ``N/n`` to
add them: about ``2N`` bytes copied, against gloo's ``2(n-1)/n·N`` sent through the kernel's socket buffers
(each byte copied into the socket and out again, so twice that) plus the adds and gloo's own threads.
``benchmarks/shm_allreduce.py`` profiles the five steps.
The one-time cost is setting up the mapping per process group (and again when a larger tensor comes).

Same signature as ``course.collectives.allreduce``'s naive, ring and tree (``tensor, op, group, check``). Its halves,
:func:`shm_reduce` (steps 1-4, then only group rank 0 copies out) and :func:`shm_broadcast` (rank 0 writes the
result, the others copy it out), are the intra-node levels of ``course.collectives.hierarchical``. Taught in
``notebooks/05b_nodes.ipynb``; ``benchmarks/shm_allreduce.py`` measures it against gloo.

The agreement check (``check=True``) costs no message: each rank writes its call (numel, dtype, op, shape)
into its row of a small shared header before the first barrier, and after it every rank reads every row, so
all ranks raise the same ``ValueError`` together when one differs.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from course.collectives.protocol import DTYPES, OPS, Op, op_name, validate_tensor
from course.collectives.shm_group import HEADER_ROW, SharedGroup, shared_group

#: Header row per rank: numel, dtype, op, kind, dim, then up to _CHECKED_DIMS sizes (later ones folded).
_CHECKED_DIMS = HEADER_ROW - 5
KINDS = ("allreduce", "reduce", "broadcast", "failed")


def shm_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                  check: bool = True) -> torch.Tensor:
    """Allreduce through a buffer in shared memory that every rank of ``group`` maps (module docstring).

    Args:
        tensor: contiguous float16/bfloat16/float32/float64 CPU tensor, any shape, same shape and dtype on
            every rank. Overwritten with the result.
        op: ``"sum"`` or ``"avg"`` (or ``dist.ReduceOp.SUM`` / ``dist.ReduceOp.AVG``).
        group: process group whose ranks all run on this host; ``None`` for the default group (or, outside
            any process group, a world of one: a no-op).
        check: compare every rank's numel, shape, dtype and op (through the shared header: no extra message)
            and raise on every rank if any differs. ``check=False`` means you promise they agree; a rank with
            a larger tensor would then read past the others' data.

    Returns:
        ``tensor`` itself, now holding the reduction on every rank.

    Raises:
        ValueError: bad ``op``, dtype, device or layout; ranks that disagree (with ``check``); ranks of the
            group on different hosts (they cannot share memory: use ``course.collectives.allreduce.ring_allreduce``).
    """
    shared, flat = _begin("allreduce", tensor, op, group, check)
    if shared is not None:
        _reduce_my_chunk(shared, flat)
        shared.barrier()  # every chunk of the result is final
        _copy_out(shared, flat, op)
    return tensor


def shm_reduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
               check: bool = True) -> torch.Tensor:
    """Reduce to group rank 0 through shared memory: :func:`shm_allreduce` without the other ranks' copy out.

    The first level of ``course.collectives.hierarchical``: the node's sum lands on its leader. Arguments as
    :func:`shm_allreduce`; ``tensor`` holds the result on group rank 0 and is left as it was elsewhere.
    """
    shared, flat = _begin("reduce", tensor, op, group, check)
    if shared is not None:
        _reduce_my_chunk(shared, flat)
        shared.barrier()
        if shared.rank == 0:
            _copy_out(shared, flat, op)
    return tensor


def shm_broadcast(tensor: torch.Tensor, group: dist.ProcessGroup | None = None, *, check: bool = True,
                  failed: bool = False) -> torch.Tensor:
    """Copy group rank 0's ``tensor`` into every rank's, through shared memory (rank 0 writes, the rest read).

    The last level of ``course.collectives.hierarchical``. Arguments as :func:`shm_allreduce`. ``failed=True`` on rank 0
    says its work before the broadcast failed (it will raise): every other rank raises instead of waiting.

    Raises:
        ValueError: as :func:`shm_allreduce`, and on the other ranks when rank 0 passed ``failed=True``.
    """
    shared, flat = _begin("failed" if failed else "broadcast", tensor, "sum", group, check)
    if shared is not None:
        if shared.rank == 0:  # after the first barrier: every rank has finished reading the last call's result
            shared.slot(shared.world_size, flat.numel(), flat.dtype).copy_(flat)
        shared.barrier()  # rank 0's tensor is in place
        if shared.rank != 0:
            flat.copy_(shared.slot(shared.world_size, flat.numel(), flat.dtype))
    return tensor


def _begin(kind: str, tensor: torch.Tensor, op: Op, group: dist.ProcessGroup | None, check: bool
           ) -> tuple[SharedGroup | None, torch.Tensor]:
    """Validate; write my call into the header and (unless a broadcast) my tensor into my slot; first barrier;
    compare the calls. Returns the group's shared memory and the flat tensor, or ``(None, flat)`` when there is
    nothing to move (a world of one, or no elements)."""
    op = op_name(op)
    validate_host_tensor(tensor)
    flat, nbytes = tensor.view(-1), tensor.numel() * tensor.element_size()
    if group is None and not dist.is_initialized():
        return None, flat  # a world of one
    shared = shared_group(group)
    if shared.world_size == 1:
        return None, flat
    # Alternate headers: a rank that returns early (numel 0) may write its next call's row while a slower one
    # still reads this call's rows; two calls later everyone has passed this call's first barrier.
    header = shared.header[shared.calls % 2]
    shared.calls += 1
    header[shared.rank] = _call(tensor, op, kind)
    fits, writes = nbytes <= shared.capacity, kind in ("allreduce", "reduce")
    if fits and nbytes and writes:
        _copy_in(shared, flat)
    shared.barrier()  # every header row and (if it fitted) every slot is written
    rows = header.clone()
    _raise_if_failed(rows, shared.rank)
    if check:
        _verify(rows, shared.rank)
    if nbytes == 0:
        return None, flat
    if not fits:  # every rank decides alike: same nbytes (checked, or promised), same capacity
        shared.grow(nbytes)
        if writes:
            _copy_in(shared, flat)
        shared.barrier()
    return shared, flat


def _my_chunk(shared: SharedGroup, numel: int) -> tuple[int, int]:
    """``(start, stop)`` of the chunk this rank reduces: ``course.collectives.allreduce.chunk_bounds``' split."""
    base, extra = divmod(numel, shared.world_size)
    start = shared.rank * base + min(shared.rank, extra)
    return start, start + base + (shared.rank < extra)


def _copy_in(shared: SharedGroup, flat: torch.Tensor) -> None:
    """Step 1: my tensor into my slot, all but my own chunk (I read that one straight from my tensor)."""
    start, stop = _my_chunk(shared, flat.numel())
    slot = shared.slot(shared.rank, flat.numel(), flat.dtype)
    slot[:start].copy_(flat[:start])
    slot[stop:].copy_(flat[stop:])


def _reduce_my_chunk(shared: SharedGroup, flat: torch.Tensor) -> None:
    """Step 3: result chunk r = my tensor's chunk r + every other slot's chunk r, in rank order after mine,
    accumulated in place in the result (no temporary). Adding in cache-sized blocks was slower here (the
    chunks of 16 MB on 4 ranks fit in L3; the extra calls cost more than they saved)."""
    n, numel = shared.world_size, flat.numel()
    start, stop = _my_chunk(shared, numel)
    if stop == start:
        return
    result = shared.slot(n, numel, flat.dtype)[start:stop]
    others = [shared.slot(k, numel, flat.dtype)[start:stop] for k in range(n) if k != shared.rank]
    torch.add(flat[start:stop], others[0], out=result)
    for other in others[1:]:
        result.add_(other)


def _copy_out(shared: SharedGroup, flat: torch.Tensor, op: Op) -> None:
    """Step 5: the whole result into my tensor, divided by the world size on the way for ``"avg"``."""
    result = shared.slot(shared.world_size, flat.numel(), flat.dtype)
    if op_name(op) == "avg":
        torch.div(result, shared.world_size, out=flat)
    else:
        flat.copy_(result)


def validate_host_tensor(tensor: torch.Tensor) -> None:
    """Raise unless ``tensor`` suits a shared-memory collective: as ``course.collectives.allreduce``'s tensors, and on
    the
    CPU (host memory is what the ranks map)."""
    validate_tensor(tensor, "shm_allreduce")
    if tensor.device.type != "cpu":
        raise ValueError(f"shm_allreduce maps host memory, so it needs a CPU tensor, got one on {tensor.device}. "
                         "On GPUs use dist.all_reduce (NCCL moves data through NVLink or shared memory itself).")


def _call(tensor: torch.Tensor, op: str, kind: str) -> torch.Tensor:
    """This rank's header row: what every rank must agree on."""
    shape = list(tensor.shape[:_CHECKED_DIMS]) + [0] * max(0, _CHECKED_DIMS - tensor.dim())
    if tensor.dim() > _CHECKED_DIMS:
        shape[-1] = math.prod(tensor.shape[_CHECKED_DIMS - 1:])
    return torch.tensor([tensor.numel(), DTYPES.index(tensor.dtype), OPS.index(op), KINDS.index(kind),
                         tensor.dim(), *shape],
                        dtype=torch.int64)


def _describe(row: list[int]) -> str:
    numel, dtype, op, kind, dim, *shape = row
    return f"numel {numel}, shape {tuple(shape[:dim])}, {DTYPES[dtype]}, op {OPS[op]!r}, shm_{KINDS[kind]}"


def _raise_if_failed(header: torch.Tensor, rank: int) -> None:
    failed = [k for k, row in enumerate(header.tolist()) if row[3] == KINDS.index("failed")]
    if failed:
        raise ValueError(f"rank {failed[0]} of this group (a node's leader) failed before its broadcast, so it "
                         f"sends none; it raises the reason itself (e.g. ranks on another node called with another "
                         f"shape). I am rank {rank} of the group.")


def _verify(header: torch.Tensor, rank: int) -> None:
    """Raise (on every rank alike: they read the same header) if any rank's row differs from rank 0's."""
    rows = header.tolist()
    odd = [k for k, row in enumerate(rows) if row != rows[0]]
    if odd:
        raise ValueError(
            f"shm_allreduce needs the same tensor shape, dtype and op (and the same call) on every rank, but "
            f"rank {odd[0]} has "
            f"{_describe(rows[odd[0]])} while rank 0 has {_describe(rows[0])} (ranks that differ from rank 0: "
            f"{odd}; I am rank {rank}). Call it with the same-shaped tensor on every rank.")


def copy_bandwidth(nbytes: int = 16 << 20, repeats: int = 9) -> float:
    """Rank function: this machine's memory copy bandwidth with every rank copying at once, in bytes per second
    per rank (bytes copied, i.e. read once and written once, as STREAM's Copy counts half its traffic). Each
    rank keeps its fastest of ``repeats`` copies, as STREAM reports its best rate (a copy that another process
    interrupted measures the scheduler, not memory); the slowest rank's best is returned. The physical limit of
    :func:`shm_allreduce` here: it copies 7/4 tensors' worth per rank and per call on 4 ranks, and adds."""
    source, target = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    target.copy_(source)  # touch the pages first: page faults are not bandwidth
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor([min(times)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return nbytes / slowest.item()
