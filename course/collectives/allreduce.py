"""Allreduce three ways, on torch.distributed point-to-point: naive, ring and tree.

Every rank holds a tensor; afterwards every rank holds the element-wise sum (or average) of all of them,
exactly what ``dist.all_reduce(tensor)`` does. The three algorithms share one signature and one shape::

    flat, comm, agreement = begin("tree", tensor, op, group, check)  # validate, view as 1-D, post shapes
    agreement.verify()                                              # every rank has the same shape
    ... the algorithm, on comm.send / recv / isend / irecv ...
    return finish(tensor, op, comm)                                 # divide by world_size for "avg"

so a student can diff them. Each is one row of :data:`ALGORITHMS` (bottom of this module): its name, the function,
its cost coefficients and its schedule for the simulation. **Adding an algorithm** is one function of that shape
and one ``register(Algorithm(...))`` row; the protocol, the simulation, the cost model, the performance model, the
timing and the distributed optimizer all read the table (``tests/collectives/test_adding_an_algorithm.py`` adds one).

Taught in ``notebooks/04_allreduce.ipynb``; :mod:`course.collectives.simulation` replays the same steps in one
process and draws them; :mod:`course.collectives.cost_model` says what each one costs. How ranks address each other,
agree on the call (``agreement``) and check its arguments is :mod:`course.collectives.protocol`.

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

import torch
import torch.distributed as dist

from course import world
from course.collectives.protocol import (
    ALGORITHMS,
    Agreement,
    Algorithm,
    Comm,
    Op,
    call_metadata,
    op_name,
    register,
    validate_tensor,
)
from course.collectives.schedules import naive_schedule, ring_schedule, tree_schedule

#: The ring cuts each chunk into pieces of about this many bytes and passes a piece on as soon as it is
#: reduced, while the next piece is still arriving (pipelining: the sends of piece k overlap the adding of
#: piece k+1). Fewer pieces cost fewer messages, more pieces overlap more. On emulated GPUs, where every
#: copy and add shares 2 cores, 4-8 MB did a few percent better than 1-2 MB in benchmarks/allreduce.py runs
#: (16 MB on 4 ranks: one piece per chunk). Where copying and adding run on separate engines (GPUs),
#: pipelining matters more.
RING_PIECE_BYTES = 4 << 20
MAX_RING_PIECES = 16
#: Backends that match point-to-point messages by tag and buffer them, so receives may be posted long before
#: their sends: gloo, for CPU tensors. Elsewhere messages are *batched*: on NCCL they queue on a GPU stream,
#: where a receive waits for its sender and holds up everything queued behind it (all messages between two
#: ranks share a stream; with ``init_process_group(device_id=...)`` all messages do), so a ring that posted its
#: receives ahead of its sends would deadlock (any ring of 2 ranks, whose left and right are the same rank).
#: There the ring sends and receives each step as one batch, and the agreement check is one batch.
TAGGED_BACKENDS = ("gloo",)
_scratch = threading.local()  # per-thread receive buffers, reused across calls (a fresh 16 MB costs page faults)


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
        check: every rank sends its numel/shape/dtype/op/algorithm to every other rank, and all raise if any
            rank disagrees. Naive and tree wait for every rank's before their first message: a wait for the
            slowest rank to arrive, ~3 ms on emulated GPUs. The ring does so only for a call that differs
            from the last one the group verified; repeating it, it tells its right neighbour only, its data moves
            at once and the check costs next to nothing (see ``Agreement``). After a mismatch ``tensor`` is
            as it was, except on the ranks of a repeated ring call, where it holds NaN. Must be the same on
            every rank.
            ``check=False`` means *you promise* that every rank passes the same shape,
            dtype, op and algorithm, e.g. because it was verified once, as ``DistributedOptimizer`` does at
            construction; if the promise is broken the result is undefined: gloo may abort the process
            (SIGABRT) or the ranks may hang.

    Returns:
        ``tensor`` itself, now holding the reduction on every rank.

    Raises:
        ValueError: bad ``op``, dtype or layout, or (with ``check``) ranks that disagree on the shape,
            dtype, op or algorithm, naming them.
    """
    flat, comm, agreement = begin("naive", tensor, op, group, check)
    agreement.verify()  # before any message: rank 0 would wait for a tensor of the wrong size
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
    return finish(tensor, op, comm)


def ring_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                   check: bool = True) -> torch.Tensor:
    """Allreduce around a ring: reduce-scatter, then all-gather, one chunk per step.

    The tensor is cut into ``world_size`` chunks (:func:`chunk_bounds`). At step ``t`` (0..2n-3) rank
    ``r`` receives chunk ``(r - t - 1) % n`` from its left neighbour and sends chunk ``(r - t) % n`` to
    its right. For the first n-1 steps (reduce-scatter) it adds what arrives into its own copy, after
    which rank ``r`` holds the full sum of chunk ``(r + 1) % n``; for the last n-1 (all-gather) what
    arrives is final and overwrites its copy. The chunk sent at step t+1 is the one received at step t,
    so each piece is passed on the moment it is ready (a pipeline, not lock-step). On NCCL the steps run in
    lock-step, each step's send and receive in one batch (see ``TAGGED_BACKENDS``).

    Args, returns and raises: as :func:`naive_allreduce`.
    """
    flat, comm, agreement = begin("ring", tensor, op, group, check)
    agreement.verify()  # a call the group has not verified yet: everyone's before any data moves (fast: no-op)
    _ring(flat, comm, before_waiting=agreement.answer_left)
    agreement.verify(flat)  # a repeated call moved its data at once: the result shows whether a rank stood in
    return finish(tensor, op, comm)


def _ring(flat: torch.Tensor, comm: Comm, hear_left: bool = True, talk_right: bool = True,
          before_waiting: Callable[[], None] = lambda: None) -> None:
    """The ring's messages (see :func:`ring_allreduce`): all receives posted up front, each piece passed on
    as soon as it is reduced; ``before_waiting`` runs once the first sends are out. A stand-in for a rank
    that is not running this ring (see :class:`Agreement`) turns off the links to neighbours that are not
    running it either."""
    n, rank = comm.world_size, comm.rank
    if n == 1 or flat.numel() == 0:
        return
    chunks = [flat[start:stop] for start, stop in chunk_bounds(flat.numel(), n)]  # views, no copies
    if comm.batched:
        return _ring_in_lock_step(chunks, comm)
    right, left = (rank + 1) % n, (rank - 1) % n
    steps = 2 * (n - 1)
    landings = _landings(chunks[0], n - 1)  # one per reduce-scatter step: (n-1)/n of the tensor

    def post_receives(step: int) -> list[tuple[torch.Tensor, torch.Tensor, dist.Work | None]]:
        chunk = chunks[(rank - step - 1) % n]
        landing = landings[step][:chunk.numel()] if step < n - 1 else chunk  # all-gather: straight in place
        return [(chunk[a:b], landing[a:b], comm.irecv(landing[a:b], left) if hear_left else None)
                for a, b in _pieces(chunk)]

    arriving = [post_receives(step) for step in range(steps)]  # all posted at once: matched in order
    sends = [comm.isend(chunks[rank][a:b], right) for a, b in _pieces(chunks[rank])] if talk_right else []
    before_waiting()
    for step in range(steps):
        for piece, landed, work in arriving[step]:
            if work is not None:
                work.wait()
                if step < n - 1:  # reduce-scatter: add; all-gather: it landed in place already
                    piece.add_(landed)
            if talk_right and step + 1 < steps:
                sends.append(comm.isend(piece, right))
    for work in sends:
        work.wait()


def _ring_in_lock_step(chunks: list[torch.Tensor], comm: Comm) -> None:
    """The ring's steps one at a time, exactly as :func:`ring_allreduce` states them, each step's send and
    receive in one batch: on NCCL, receives posted ahead of the sends would deadlock (``TAGGED_BACKENDS``)."""
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    landing = _landings(chunks[0], 1)[0]
    for step in range(2 * (n - 1)):
        outgoing, incoming = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        if step < n - 1:  # reduce-scatter: land, then add
            comm.exchange([(outgoing, right)], [(landing[:incoming.numel()], left)])
            incoming.add_(landing[:incoming.numel()])
        else:  # all-gather: straight in place
            comm.exchange([(outgoing, right)], [(incoming, left)])


def tree_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                   check: bool = True) -> torch.Tensor:
    """Allreduce on a binomial tree: reduce up to rank 0, then broadcast back down.

    Reduce: in round ``k`` (``bit = 2**k``) a rank whose lowest set bit is ``bit`` sends its partial sum
    to ``rank - bit`` and is done; a rank below it adds what ``rank + bit`` sends (if that rank exists, so
    any world size works). Broadcast retraces the same edges in reverse. ``2 * ceil(log2 n)`` rounds,
    each moving a whole tensor.

    Args, returns and raises: as :func:`naive_allreduce`.
    """
    flat, comm, agreement = begin("tree", tensor, op, group, check)
    agreement.verify()  # before any message
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
    return finish(tensor, op, comm)


def _depth(world_size: int) -> int:
    """Rounds of the binomial tree: ⌈log2 n⌉."""
    return math.ceil(math.log2(world_size)) if world_size > 1 else 0


# The table (course.collectives.protocol.ALGORITHMS): name, function, cost (a, b) on n ranks, schedule.
# The cost model's docstring explains each (a, b).
register(Algorithm("naive", naive_allreduce, lambda n: (2 * (n - 1), 2 * (n - 1)), naive_schedule))
register(Algorithm("ring", ring_allreduce, lambda n: (2 * (n - 1), 2 * (n - 1) / n), ring_schedule))
register(Algorithm("tree", tree_allreduce, lambda n: (2 * _depth(n), 2 * _depth(n)), tree_schedule))


def _landings(like: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``count`` scratch vectors with room for ``like`` each, carved from one buffer kept per thread (so a
    communication thread and the main thread never share one) and reused while dtype, device and size allow."""
    cached = getattr(_scratch, "buffer", None)
    if cached is None or cached.dtype != like.dtype or cached.device != like.device \
            or cached.numel() < count * like.numel():
        cached = _scratch.buffer = torch.empty(count * like.numel(), dtype=like.dtype, device=like.device)
    return list(cached[:count * like.numel()].view(count, like.numel()))


def compare_with_reference(numel: int = 100_003, seed: int = 0) -> dict[str, float]:
    """Run on every rank (via ``course.runtime.launch.launch``): each algorithm and ``dist.all_reduce`` on the same
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


def begin(algorithm: str, tensor: torch.Tensor, op: Op, group: dist.ProcessGroup | None, check: bool
          ) -> tuple[torch.Tensor, Comm, Agreement]:
    """How every allreduce starts: validate the arguments, find this rank in ``group``, start the agreement check
    (also on which ``algorithm`` every rank runs: their messages differ), and view the tensor as 1-D.

    Returns:
        ``(flat, comm, agreement)``: ``tensor`` as 1-D (a view: writing it writes ``tensor``), this rank's
        point-to-point calls, and the check to ``verify()`` before (or while) the data moves.
    """
    op = op_name(op)
    validate_tensor(tensor)
    if group is None and not dist.is_initialized():
        comm = Comm(0, 1, None)  # no process group: a world of one, like course.world.current()
    else:
        group = group if group is not None else dist.group.WORLD
        comm = Comm(dist.get_rank(group), dist.get_world_size(group), group,
                     batched=tensor.device.type != "cpu" or dist.get_backend(group) not in TAGGED_BACKENDS)
    if check and comm.world_size > 1:
        agreement = Agreement.post(call_metadata(tensor, op, algorithm), tensor.device, comm, _ring)
    else:
        agreement = Agreement([], comm, fast=True)  # nothing to check: agrees with everyone
    return tensor.view(-1), comm, agreement


def finish(tensor: torch.Tensor, op: Op, comm: Comm) -> torch.Tensor:
    """How every allreduce ends: divide by the world size for ``"avg"``; returns ``tensor``."""
    if op_name(op) == "avg" and comm.world_size > 1:
        tensor.div_(comm.world_size)
    return tensor
