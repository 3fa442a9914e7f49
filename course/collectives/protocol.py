"""The protocol under ``course.collectives.allreduce``: how ranks address each other, and how they agree on the call.

:class:`Comm` is one rank's point-to-point calls, addressed by group rank. :class:`Agreement` is the check
that every rank makes the same allreduce call (numel, dtype, op, algorithm, shape) before or, for a repeated
ring call, while its data moves, so that a mismatch is an error naming the rank instead of a hang or a gloo
abort. :func:`validate_tensor` and :func:`op_name` check what a call is given (every allreduce of the course
shares them: ``course.collectives.allreduce``, ``course.collectives.shm_allreduce``,
``course.collectives.hierarchical``). The algorithms themselves are in :mod:`course.collectives.allreduce`, which
is what ``notebooks/04_allreduce.ipynb`` teaches; this module is what makes them safe to call wrong.

:data:`ALGORITHMS` is the one table of the allreduce algorithms (:class:`Algorithm`: name, function, cost,
schedule). :mod:`course.collectives.allreduce` fills it; a call names its algorithm to the other ranks by its
position in it, the simulation plays its schedules, the cost model and the performance model read its costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from course import world

OPS = ("sum", "avg")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: ``op`` may also be torch's own constant, as in ``dist.all_reduce(tensor, op=dist.ReduceOp.SUM)``.
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
Op = str | dist.ReduceOp | dist.ReduceOp.RedOpType


@dataclass(frozen=True)
class Algorithm:
    """One allreduce algorithm, as everything that lists the algorithms reads it.

    Attributes:
        name: what callers pass as ``algorithm`` (``"ring"``).
        run: ``run(tensor, op="sum", group=None, *, check=True) -> tensor`` on every rank, in place, as
            ``course.collectives.allreduce.ring_allreduce``.
        cost: ``cost(world_size) -> (a, b)``: the algorithm costs ``a·α + b·N·β`` for ``N`` bytes
            (:func:`course.collectives.cost_model.coefficients`).
        schedule: ``schedule(world_size) -> list[Step]``, its messages step by step
            (:mod:`course.collectives.simulation`); None if it has none to show.
    """

    name: str
    run: Callable[..., torch.Tensor]
    cost: Callable[[int], tuple[float, float]]
    schedule: Callable[[int], list] | None = None

    def __call__(self, tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                 check: bool = True) -> torch.Tensor:
        return self.run(tensor, op, group, check=check)


#: The allreduce algorithms by name, in the order they were registered: a call names its algorithm to the other
#: ranks by its position here, so every rank must register the same algorithms in the same order.
ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Add one row to :data:`ALGORITHMS`.

    Raises:
        ValueError: an algorithm of that name is registered already.
    """
    if algorithm.name in ALGORITHMS:
        raise ValueError(f"an allreduce algorithm named {algorithm.name!r} is registered already; pick another name.")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm
#: Shape dimensions sent in the agreement check; later ones are folded into the last slot.
_CHECKED_DIMS = 6


@dataclass(frozen=True)
class Comm:
    """Who I am in ``group``, and point-to-point calls addressed by group rank.

    They call the process group's own ``send``/``recv`` (what ``dist.isend``/``dist.irecv`` end in), skipping
    the checks ``dist`` repeats on every message: 20-30 us of Python each, which on 2 shared cores is time
    taken from another rank's copying and adding."""

    rank: int
    world_size: int
    group: dist.ProcessGroup | None  # None only in a world of one, which sends nothing
    batched: bool = False  # send and receive in batches: not gloo on CPU (see ``allreduce.TAGGED_BACKENDS``)

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        self.isend(tensor, peer).wait()

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        self.irecv(tensor, peer).wait()

    def isend(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> dist.Work:
        return self.group.send([tensor], peer, tag)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int = 0) -> dist.Work:
        return self.group.recv([tensor], peer, tag)

    def exchange(self, sends: list[tuple[torch.Tensor, int]], receives: list[tuple[torch.Tensor, int]]) -> None:
        """Send each ``(tensor, peer)`` of ``sends`` while receiving each of ``receives``, as one batch, and wait
        for all of them (an empty tensor is skipped: its peer skips it too)."""
        ops = [dist.P2POp(dist.isend, tensor, group=self.group, group_peer=peer) for tensor, peer in sends
               if tensor.numel()]
        ops += [dist.P2POp(dist.irecv, tensor, group=self.group, group_peer=peer) for tensor, peer in receives
                if tensor.numel()]
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()


def validate_tensor(tensor: torch.Tensor, caller: str = "allreduce") -> None:
    """Raise unless ``tensor`` is one an in-place allreduce can take: a contiguous torch.Tensor of a dtype in
    ``DTYPES``. ``caller`` names the function in the message (``course.collectives.allreduce``,
    ``course.collectives.shm_allreduce``).

    Raises:
        TypeError: not a tensor. ValueError: another dtype, or not contiguous (each message says the fix).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{caller} needs a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in DTYPES:
        raise ValueError(f"{caller} supports dtypes {[str(d) for d in DTYPES]}, got {tensor.dtype}. "
                         "Convert with tensor.float() (and copy back) first.")
    if not tensor.is_contiguous():
        raise ValueError(f"{caller} works in place on a contiguous tensor, got one with strides "
                         f"{tensor.stride()} for shape {tuple(tensor.shape)}. Reduce t = x.contiguous(), "
                         "then x.copy_(t).")


def op_name(op: Op) -> str:
    """``"sum"`` or ``"avg"`` for either spelling of ``op``; raise naming the allowed values otherwise."""
    if isinstance(op, str) and op in OPS:
        return op
    if isinstance(op, dist.ReduceOp | dist.ReduceOp.RedOpType):  # not ints: ReduceOp.SUM == 0 is True
        for name, reduce_op in REDUCE_OPS.items():
            if op == reduce_op:
                return name
    raise ValueError(f"op must be one of {OPS} or dist.ReduceOp.SUM / dist.ReduceOp.AVG, got {op!r}. "
                     "(max, min and product are not taught here: use dist.all_reduce for them.)")


#: The ring's message loop, ``ring(flat, comm, hear_left, talk_right)`` (``course.collectives.allreduce._ring``).
Ring = Callable[..., None]


def call_metadata(tensor: torch.Tensor, op: str, algorithm: str) -> list[int]:
    shape = list(tensor.shape[:_CHECKED_DIMS]) + [0] * max(0, _CHECKED_DIMS - tensor.dim())
    if tensor.dim() > _CHECKED_DIMS:
        shape[-1] = math.prod(tensor.shape[_CHECKED_DIMS - 1:])
    return [tensor.numel(), DTYPES.index(tensor.dtype), OPS.index(op), list(ALGORITHMS).index(algorithm),
            tensor.dim(), *shape]


def describe(metadata: list[int]) -> str:
    numel, dtype, op, algorithm, dim, *shape = metadata
    return (f"numel {numel}, shape {tuple(shape[:dim])}, {DTYPES[dtype]}, op {OPS[op]!r}, "
            f"{list(ALGORITHMS)[algorithm]} allreduce")


_CALL_TAG, _ANSWER_TAG, _EVERYONE_TAG = 1, 2, 3  # the data goes on tag 0
#: Per process group, the last call every rank was verified to agree on (ring calls only).
verified: dict[dist.ProcessGroup, list[int]] = {}
world.forget_on_shutdown(verified.clear)  # a group kept past shutdown aborts ranks at exit


@dataclass
class Agreement:
    """Whether every rank makes this call: same numel, dtype, op, algorithm and shape.

    Without it, a rank with a shorter tensor would wait forever for bytes nobody sends, or gloo would abort
    a process that receives more than it has room for: this turns both into an error on every rank that
    names the rank that differs. Each rank tells *everyone* its call (one hop of n-1 tiny messages;
    ``dist.all_gather`` would take n-1 hops and a hand-off to gloo's worker thread), and waits for all of
    theirs before its data moves: a wait for the slowest rank to arrive (~3 ms on emulated GPUs).

    A ring call that repeats the group's last verified call is *fast*: it tells only its right neighbour,
    on the link that carries its data anyway (so it costs next to nothing), and its data moves at once. A
    rank that changed its call is *slow*: it tells its right neighbour and everyone. Every rank reads its
    left neighbour's call before waiting for data from it, and answers with its own if that neighbour is
    slow. So a slow rank learns both neighbours' calls, and next to a fast one it stands in for the ring
    towards its fast neighbours (the ring's messages on NaN of their shape), so they finish, with NaN everywhere:
    every chunk passes through a stand-in on its way round. A fast rank whose result does not start with
    NaN therefore knows every rank made its call; one whose result does (a mismatch, or a NaN in the data)
    tells everyone too, and every rank compares all the calls and raises if any differs. Naive and tree are
    always slow, and so is every batched call (``TAGGED_BACKENDS``), which tells everyone in one batch.
    Unposted (``check=False`` or a world of one) it verifies nothing.
    """

    mine: list[int]
    comm: Comm
    fast: bool
    device: torch.device = torch.device("cpu")
    left: torch.Tensor | None = None  # my left neighbour's call, as it sent it
    right: torch.Tensor | None = None  # my right neighbour's answer (slow calls only)
    everyone: dict[int, torch.Tensor] = field(default_factory=dict)  # every other rank's call, as it sent it
    hearing_left: list[dist.Work] = field(default_factory=list)  # each list waited once: a second wait()
    hearing_right: list[dist.Work] = field(default_factory=list)  # on a finished gloo recv hangs forever
    hearing_everyone: list[dist.Work] = field(default_factory=list)
    sending: list[dist.Work] = field(default_factory=list)
    done: bool = False
    ring: Ring | None = None  # the ring's message loop, for a stand-in (allreduce._ring)

    @classmethod
    def post(cls, metadata: list[int], device: torch.device, comm: Comm, ring: Ring) -> Agreement:
        """Start the check of this rank's call (``metadata``, from :func:`call_metadata`): send it, post the
        receives. ``ring`` is the ring's message loop, which a slow rank runs as a stand-in."""
        fast = not comm.batched and metadata[0] > 0 and metadata == verified.get(comm.group)
        agreement = cls(metadata, comm, fast, device=device, ring=ring)
        if not comm.batched:
            agreement._tell_right()
        if not fast:
            agreement._tell_everyone()
        return agreement

    def answer_left(self) -> None:
        """Read my left neighbour's call and, if it is slow, answer with mine (it waits for that to learn
        whether I run the ring). A fast call does this before it first waits for data: a slow left
        neighbour sends none until answered."""
        if self.left is None or not self.hearing_left:
            return
        wait_once(self.hearing_left)
        if not self.left[-1].item():
            left = (self.comm.rank - 1) % self.comm.world_size
            self.sending.append(self.comm.isend(self._message(), left, _ANSWER_TAG))

    def verify(self, result: torch.Tensor | None = None) -> None:
        """Raise ValueError on every rank, naming the ranks whose call differs from rank 0's, if any do. A slow
        call verifies before its data moves; a fast one after, from its ``result``. Later calls return at once."""
        if self.done or not (self.left is not None or self.everyone) or (self.fast and result is None):
            return
        self.done = True
        self.answer_left()
        if self.fast:
            if not math.isnan(result[0].item()):
                wait_once(self.sending)
                return  # no rank stood in (it would have sent NaN): every rank made this very call
            self._tell_everyone()  # a stand-in's NaN, or the data's own: compare everyone's call
        elif self.right is not None:
            wait_once(self.hearing_right)
            left, right = bool(self.left[-1].item()), bool(self.right[-1].item())
            if left or right:  # a fast neighbour is running the ring: the calls differ
                self._stand_in((self.left if left else self.right).tolist()[:-1], left, right)
        wait_once(self.hearing_everyone)
        wait_once(self.sending)
        calls = [self.everyone[peer].tolist()[:-1] if peer in self.everyone else self.mine
                 for peer in range(self.comm.world_size)]
        odd = [r for r, call in enumerate(calls) if call != calls[0]]
        if not odd:
            if list(ALGORITHMS)[self.mine[3]] == "ring":  # the only one that has a fast path
                verified[self.comm.group] = self.mine
            return
        verified.pop(self.comm.group, None)
        raise ValueError(
            f"allreduce needs the same tensor shape, dtype, op and algorithm on every rank, but rank {odd[0]} "
            f"has {describe(calls[odd[0]])} while rank 0 has {describe(calls[0])} (ranks that differ "
            f"from rank 0: {odd}; I am rank {self.comm.rank}). Call the same allreduce with the same-shaped "
            "tensor on every rank."
        )

    def _message(self) -> torch.Tensor:
        return torch.tensor([*self.mine, self.fast], dtype=torch.int64, device=self.device)

    def _tell_right(self) -> None:
        """Send my call to my right neighbour and post a receive for my left one's (and, slow, for my right
        one's answer), on tags of their own: these never meet the data, whichever is sent first."""
        comm, sent = self.comm, self._message()
        left, right = (comm.rank - 1) % comm.world_size, (comm.rank + 1) % comm.world_size
        self.left = torch.empty_like(sent)
        self.hearing_left = [comm.irecv(self.left, left, _CALL_TAG)]
        self.sending = [comm.isend(sent, right, _CALL_TAG)]
        if not self.fast:
            self.right = torch.empty_like(sent)
            self.hearing_right = [comm.irecv(self.right, right, _ANSWER_TAG)]

    def _tell_everyone(self) -> None:
        """Send my call to every other rank and post receives for theirs."""
        comm, sent = self.comm, self._message()
        peers = [peer for peer in range(comm.world_size) if peer != comm.rank]
        self.everyone = {peer: torch.empty_like(sent) for peer in peers}
        if not comm.batched:
            self.hearing_everyone = [comm.irecv(self.everyone[peer], peer, _EVERYONE_TAG) for peer in peers]
            self.sending += [comm.isend(sent, peer, _EVERYONE_TAG) for peer in peers]
            return
        # NCCL has no tags, and sends and receives must go in one batch (see TAGGED_BACKENDS): wait for it now
        comm.exchange([(sent, peer) for peer in peers], [(self.everyone[peer], peer) for peer in peers])

    def _stand_in(self, fast_call: list[int], hear_left: bool, talk_right: bool) -> None:
        """Exchange with my fast neighbours what a ring rank with their call would, all NaN, so they finish."""
        numel, dtype = fast_call[0], DTYPES[fast_call[1]]
        poison = torch.full((numel,), math.nan, dtype=dtype, device=self.device)
        self.ring(poison, self.comm, hear_left=hear_left, talk_right=talk_right)


def wait_once(works: list[dist.Work]) -> None:
    """Wait for each of ``works``, then forget them: gloo hangs on a second wait() for a finished receive."""
    for work in works:
        work.wait()
    works.clear()
