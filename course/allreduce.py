"""Allreduce three ways, on torch.distributed point-to-point: naive, ring and tree.

Every rank holds a tensor; afterwards every rank holds the element-wise sum (or average) of all of them,
exactly what ``dist.all_reduce(tensor)`` does. The three algorithms share one signature and one shape::

    flat, comm = _begin("ring", tensor, op, group, check)  # validate, agree on shapes, view as 1-D
    ... the algorithm, on comm.send / recv / isend / irecv ...
    return _finish(tensor, op, comm)                       # divide by world_size for "avg"

so a student can diff them. Taught in ``notebooks/04_allreduce.ipynb``; ``course.allreduce_sim`` replays the
same steps in one process and draws them; ``course.cost_model`` says what each one costs.

- **naive** (the parameter-server pattern): everyone sends its tensor to rank 0, rank 0 adds them up and
  sends the result back. Rank 0's link carries 2(n-1) full tensors: it does not scale.
- **ring**: reduce-scatter then all-gather around a ring, one chunk (1/n of the tensor) per step, 2(n-1)
  steps. Every link carries 2(n-1)/n of the tensor whatever n is: bandwidth-optimal.
- **tree**: reduce up a binomial tree to rank 0, broadcast back down, 2*ceil(log2 n) steps of a full
  tensor each: few steps (good for small tensors), but full tensors on every step (bad for big ones).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import world

OPS = ("sum", "avg")
#: ``op`` may also be torch's own constant, as in ``dist.all_reduce(tensor, op=dist.ReduceOp.SUM)``.
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
Op = str | dist.ReduceOp | dist.ReduceOp.RedOpType
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Shape dimensions sent in the agreement check; later ones are folded into the last slot.
_CHECKED_DIMS = 6
#: The ring cuts each chunk into pieces of about this many bytes and passes a piece on as soon as it is
#: reduced, while the next piece is still arriving (pipelining: the sends of piece k overlap the adding of
#: piece k+1). Fewer pieces cost fewer messages, more pieces overlap more. On emulated GPUs 2 MB did best
#: among 0.25-16 MB in benchmarks/allreduce.py runs, though by less than a shared machine's noise (16 MB on 4
#: ranks: two pieces per chunk). Where copying and adding run on separate engines (GPUs) it matters more.
RING_PIECE_BYTES = 2 << 20
MAX_RING_PIECES = 16
_scratch = threading.local()  # per-thread receive buffers, reused across calls (a fresh 16 MB costs page faults)


@dataclass(frozen=True)
class _Comm:
    """Who I am in ``group``, and point-to-point calls addressed by group rank."""

    rank: int
    world_size: int
    group: dist.ProcessGroup | None

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        dist.send(tensor, self._global(peer), group=self.group)

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        dist.recv(tensor, self._global(peer), group=self.group)

    def isend(self, tensor: torch.Tensor, peer: int) -> dist.Work:
        return dist.isend(tensor, self._global(peer), group=self.group)

    def irecv(self, tensor: torch.Tensor, peer: int) -> dist.Work:
        return dist.irecv(tensor, self._global(peer), group=self.group)


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``range(numel)`` into ``world_size`` contiguous chunks whose sizes differ by at most one.

    The first ``numel % world_size`` chunks get one extra element, so 10 elements on 4 ranks are
    ``[(0, 3), (3, 6), (6, 8), (8, 10)]``; with fewer elements than ranks the last chunks are empty.

    Returns:
        ``[(start, stop), ...]``, one half-open interval per chunk, in order, covering ``range(numel)``.
    """
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for chunk in range(world_size):
        stop = start + base + (chunk < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def naive_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                    check: bool = True) -> torch.Tensor:
    """Allreduce through rank 0, the parameter-server pattern: gather, reduce, broadcast.

    Args:
        tensor: contiguous float16/bfloat16/float32/float64 tensor, any shape, same shape and dtype on every
            rank, on this rank's device. Overwritten with the result.
        op: ``"sum"``, or ``"avg"`` (the sum divided by the world size); or, as for ``dist.all_reduce``,
            ``dist.ReduceOp.SUM`` or ``dist.ReduceOp.AVG``.
        group: process group to reduce over; ``None`` for the default group (or, outside any process
            group, a world of one: a no-op).
        check: first exchange numel/shape/dtype/op/algorithm with every rank and raise if any rank
            disagrees (one small collective, ~1-4 ms on emulated GPUs, a fixed cost per call). Must be the
            same on every rank. ``check=False`` means *you promise* that every rank passes the same shape,
            dtype, op and algorithm, e.g. because it was verified once, as ``DistributedOptimizer`` does at
            construction; if the promise is broken the result is undefined: gloo may abort the process
            (SIGABRT) or the ranks may hang.

    Returns:
        ``tensor`` itself, now holding the reduction on every rank.

    Raises:
        ValueError: bad ``op``, dtype or layout, or (with ``check``) ranks that disagree on the shape,
            dtype, op or algorithm, naming them.
    """
    flat, comm = _begin("naive", tensor, op, group, check)
    if comm.world_size > 1 and flat.numel() > 0:
        if comm.rank == 0:
            incoming = torch.empty_like(flat)
            for source in range(1, comm.world_size):  # rank 0's one link takes them one at a time
                comm.recv(incoming, source)
                flat.add_(incoming)
            for work in [comm.isend(flat, peer) for peer in range(1, comm.world_size)]:
                work.wait()
        else:
            comm.send(flat, 0)
            comm.recv(flat, 0)
    return _finish(tensor, op, comm)


def ring_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                   check: bool = True) -> torch.Tensor:
    """Allreduce around a ring: reduce-scatter, then all-gather, one chunk per step.

    The tensor is cut into ``world_size`` chunks (:func:`chunk_bounds`). At step ``t`` (0..2n-3) rank
    ``r`` receives chunk ``(r - t - 1) % n`` from its left neighbour and sends chunk ``(r - t) % n`` to
    its right. For the first n-1 steps (reduce-scatter) it adds what arrives into its own copy, after
    which rank ``r`` holds the full sum of chunk ``(r + 1) % n``; for the last n-1 (all-gather) what
    arrives is final and overwrites its copy. The chunk sent at step t+1 is the one received at step t,
    so each piece is passed on the moment it is ready (a pipeline, not lock-step).

    Args, returns and raises: as :func:`naive_allreduce`.
    """
    flat, comm = _begin("ring", tensor, op, group, check)
    n, rank = comm.world_size, comm.rank
    if n > 1 and flat.numel() > 0:
        chunks = [flat[start:stop] for start, stop in chunk_bounds(flat.numel(), n)]  # views, no copies
        right, left = (rank + 1) % n, (rank - 1) % n
        steps = 2 * (n - 1)
        buffers = _buffers(chunks[0])  # two, so step t+1 can arrive while step t is being added

        def post_receives(step: int) -> list[tuple[torch.Tensor, torch.Tensor, dist.Work]]:
            chunk = chunks[(rank - step - 1) % n]
            landing = buffers[step % 2][:chunk.numel()] if step < n - 1 else chunk
            return [(chunk[a:b], landing[a:b], comm.irecv(landing[a:b], left)) for a, b in _pieces(chunk)]

        sends = [comm.isend(chunks[rank][a:b], right) for a, b in _pieces(chunks[rank])]
        arriving = post_receives(0)
        for step in range(steps):
            current, arriving = arriving, post_receives(step + 1) if step + 1 < steps else []
            for piece, landed, work in current:
                work.wait()
                if step < n - 1:  # reduce-scatter: add; all-gather: it landed in place already
                    piece.add_(landed)
                if step + 1 < steps:
                    sends.append(comm.isend(piece, right))
        for work in sends:
            work.wait()
    return _finish(tensor, op, comm)


def tree_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                   check: bool = True) -> torch.Tensor:
    """Allreduce on a binomial tree: reduce up to rank 0, then broadcast back down.

    Reduce: in round ``k`` (``bit = 2**k``) a rank whose lowest set bit is ``bit`` sends its partial sum
    to ``rank - bit`` and is done; a rank below it adds what ``rank + bit`` sends (if that rank exists, so
    any world size works). Broadcast retraces the same edges in reverse. ``2 * ceil(log2 n)`` rounds,
    each moving a whole tensor.

    Args, returns and raises: as :func:`naive_allreduce`.
    """
    flat, comm = _begin("tree", tensor, op, group, check)
    n, rank = comm.world_size, comm.rank
    if n > 1 and flat.numel() > 0:
        incoming = torch.empty_like(flat)
        top = 1 << math.ceil(math.log2(n))
        bit = 1
        while bit < top:  # reduce towards rank 0
            if rank & bit:
                comm.send(flat, rank - bit)
                break
            if rank + bit < n:
                comm.recv(incoming, rank + bit)
                flat.add_(incoming)
            bit <<= 1
        if rank > 0:  # broadcast back down the same edges
            comm.recv(flat, rank - bit)
        bit >>= 1
        while bit > 0:
            if rank + bit < n:
                comm.send(flat, rank + bit)
            bit >>= 1
    return _finish(tensor, op, comm)


ALGORITHMS: dict[str, Callable[..., torch.Tensor]] = {
    "naive": naive_allreduce,
    "ring": ring_allreduce,
    "tree": tree_allreduce,
}


def _buffers(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two scratch vectors with room for ``like``, kept per thread (so a communication thread and the main
    thread never share one) and reused while the dtype, device and size allow."""
    cached = getattr(_scratch, "buffers", None)
    if cached is None or cached[0].dtype != like.dtype or cached[0].device != like.device \
            or cached[0].numel() < like.numel():
        cached = _scratch.buffers = (torch.empty_like(like), torch.empty_like(like))
    return cached[0][:like.numel()], cached[1][:like.numel()]


def compare_with_reference(numel: int = 100_003, seed: int = 0) -> dict[str, float]:
    """Run on every rank (via ``course.launch.launch``): each algorithm and ``dist.all_reduce`` on the same
    random float64 tensor; the largest difference from ``dist.all_reduce`` per algorithm, for notebook 04."""
    generator = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    mine = torch.randn(numel, generator=generator, dtype=torch.float64).to(world.current().device)
    reference = mine.clone()
    dist.all_reduce(reference)
    differences = {}
    for name, allreduce in ALGORITHMS.items():
        differences[name] = (allreduce(mine.clone()) - reference).abs().max().item()
    return differences


def _pieces(chunk: torch.Tensor) -> list[tuple[int, int]]:
    """Where the ring cuts a chunk into pieces; sender and receiver of a chunk agree (same numel)."""
    if chunk.numel() == 0:  # fewer elements than ranks: nothing to send for this chunk
        return []
    count = max(1, min(MAX_RING_PIECES, chunk.numel() * chunk.element_size() // RING_PIECE_BYTES))
    return chunk_bounds(chunk.numel(), count)


def _begin(algorithm: str, tensor: torch.Tensor, op: Op, group: dist.ProcessGroup | None, check: bool
           ) -> tuple[torch.Tensor, _Comm]:
    """Validate the arguments, find this rank in ``group``, check agreement (also on which ``algorithm``
    every rank runs: their messages differ), and view the tensor as 1-D."""
    op = _op_name(op)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allreduce needs a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in DTYPES:
        raise ValueError(f"allreduce supports dtypes {[str(d) for d in DTYPES]}, got {tensor.dtype}. "
                         "Convert with tensor.float() (and copy back) first.")
    if not tensor.is_contiguous():
        raise ValueError(f"allreduce works in place on a contiguous tensor, got one with strides "
                         f"{tensor.stride()} for shape {tuple(tensor.shape)}. Reduce t = x.contiguous(), "
                         "then x.copy_(t).")
    if group is None and not dist.is_initialized():
        comm = _Comm(0, 1, None)  # no process group: a world of one, like course.world.current()
    else:
        comm = _Comm(dist.get_rank(group), dist.get_world_size(group), group)
    if check and comm.world_size > 1:
        _check_agreement(tensor, op, algorithm, comm)
    return tensor.view(-1), comm


def _op_name(op: Op) -> str:
    """``"sum"`` or ``"avg"`` for either spelling of ``op``; raise naming the allowed values otherwise."""
    if isinstance(op, str) and op in OPS:
        return op
    if isinstance(op, dist.ReduceOp | dist.ReduceOp.RedOpType):  # not ints: ReduceOp.SUM == 0 is True
        for name, reduce_op in REDUCE_OPS.items():
            if op == reduce_op:
                return name
    raise ValueError(f"op must be one of {OPS} or dist.ReduceOp.SUM / dist.ReduceOp.AVG, got {op!r}. "
                     "(max, min and product are not taught here: use dist.all_reduce for them.)")


def _finish(tensor: torch.Tensor, op: Op, comm: _Comm) -> torch.Tensor:
    if _op_name(op) == "avg" and comm.world_size > 1:
        tensor.div_(comm.world_size)
    return tensor


def _metadata(tensor: torch.Tensor, op: str, algorithm: str) -> list[int]:
    shape = list(tensor.shape[:_CHECKED_DIMS]) + [0] * max(0, _CHECKED_DIMS - tensor.dim())
    if tensor.dim() > _CHECKED_DIMS:
        shape[-1] = math.prod(tensor.shape[_CHECKED_DIMS - 1:])
    return [tensor.numel(), DTYPES.index(tensor.dtype), OPS.index(op), list(ALGORITHMS).index(algorithm),
            tensor.dim(), *shape]


def _describe(metadata: list[int]) -> str:
    numel, dtype, op, algorithm, dim, *shape = metadata
    return (f"numel {numel}, shape {tuple(shape[:dim])}, {DTYPES[dtype]}, op {OPS[op]!r}, "
            f"{list(ALGORITHMS)[algorithm]} allreduce")


def _check_agreement(tensor: torch.Tensor, op: str, algorithm: str, comm: _Comm) -> None:
    """All-gather every rank's (numel, dtype, op, algorithm, shape) and raise on every rank if any differ.

    Without this, a rank with a shorter tensor would wait forever for bytes nobody sends (or receive more
    than it has room for): this turns a silent hang into an error that names the rank.
    """
    mine = torch.tensor(_metadata(tensor, op, algorithm), dtype=torch.int64, device=tensor.device)
    gathered = [torch.empty_like(mine) for _ in range(comm.world_size)]
    dist.all_gather(gathered, mine, group=comm.group)
    everyone = [g.tolist() for g in gathered]
    odd = [r for r, meta in enumerate(everyone) if meta != everyone[0]]
    if odd:
        raise ValueError(
            f"allreduce needs the same tensor shape, dtype, op and algorithm on every rank, but rank {odd[0]} has "
            f"{_describe(everyone[odd[0]])} while rank 0 has {_describe(everyone[0])} (ranks that differ "
            f"from rank 0: {odd}; I am rank {comm.rank}). Call the same allreduce with the same-shaped tensor on "
            "every rank."
        )
