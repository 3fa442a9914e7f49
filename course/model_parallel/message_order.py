"""Will these sends and receives finish? Each stage's message order, simulated before any rank starts.

A pipeline stage posts sends and receives in its own order. A receive from rank q completes once q has posted a
send to it (messages between two ranks match first to first, as gloo and NCCL match them); a send completes once
its receiver has posted the matching receive. A stage blocked on a wait that nothing can complete waits for
ever. :func:`simulate` plays every stage's calls together and returns None when all finish, or a
:class:`Stuck` saying who waits for whom, at which step of whose schedule: "rank 2 waits to receive from rank 3
(during B0, its receive number 1 from rank 3); rank 3 waits ...". That takes milliseconds, where the real run
would wait for its time limit. Used by the pipeline runner lab's pre-run check (:mod:`grader.labs`) and notebook 08.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """One message call of one stage, in the order the stage makes them."""

    kind: str  # "send" or "recv": post a message (isend/irecv); "wait": wait for the request posted at ``request``
    peer: int = -1  # the other rank (send/recv)
    request: int = -1  # for "wait": the index (in this stage's calls) of the send or recv it waits for
    during: str = ""  # what the stage was doing, e.g. "F3" (the forward of micro-batch 3) or "B0"


@dataclass(frozen=True)
class Stuck:
    """A deadlock: every unfinished stage waits on a message nobody will post."""

    waits: tuple[str, ...]  # one line per waiting rank

    def __str__(self) -> str:
        return "; ".join(self.waits)


def blocking(kind: str, peer: int, during: str = "", calls: list[Call] | None = None) -> list[Call]:
    """A blocking ``send``/``recv`` as two calls: post it, then wait for it (appended to ``calls`` if given)."""
    calls = [] if calls is None else calls
    calls += [Call(kind, peer, during=during), Call("wait", request=len(calls), during=during)]
    return calls


def _matches(stages: Sequence[Sequence[Call]], progress: list[int]) -> set[tuple[int, int]]:
    """(rank, call index) of every posted send and recv that has met its partner so far."""
    posted: dict[tuple[int, int, str], list[int]] = defaultdict(list)  # (from, to, kind) -> call indices, in order
    for rank, calls in enumerate(stages):
        for index, call in enumerate(calls[:progress[rank]]):
            if call.kind == "send":
                posted[(rank, call.peer, "send")].append(index)
            elif call.kind == "recv":
                posted[(call.peer, rank, "recv")].append(index)
    matched = set()
    for (source, target, kind), indices in posted.items():
        if kind != "send":
            continue
        receives = posted.get((source, target, "recv"), [])
        for send, recv in zip(indices, receives, strict=False):  # first send meets first receive
            matched |= {(source, send), (target, recv)}
    return matched


def _waiting(stages: Sequence[Sequence[Call]], rank: int, index: int) -> str:
    """"rank 2 waits to receive from rank 3 (during B0, its receive number 1 from rank 3)"."""
    calls = stages[rank]
    call = calls[index]
    at = call.request if call.kind == "wait" else index
    posted = calls[at]
    number = sum(1 for c in calls[:at + 1] if c.kind == posted.kind and c.peer == posted.peer)
    way, noun = ("receive from", "receive") if posted.kind == "recv" else ("send to", "send")
    during = f"during {call.during}, " if call.during else ""
    return (f"rank {rank} waits to {way} rank {posted.peer} ({during}its {noun} number {number} "
            f"{way.split()[1]} rank {posted.peer})")


def simulate(stages: Sequence[Sequence[Call]]) -> Stuck | None:
    """Play every stage's calls together; None if every stage gets through all of them, else who waits for whom.

    Posting never blocks; a wait blocks until its send or receive has met its partner. The stages advance in
    turn until none can: then every stage not at its end is stuck.

    Raises:
        ValueError: a call naming a rank outside the pipeline, or a wait on something that is not a send or recv.
    """
    for rank, calls in enumerate(stages):
        for call in calls:
            if call.kind in ("send", "recv") and not 0 <= call.peer < len(stages):
                raise ValueError(f"rank {rank} {call.kind}s {'to' if call.kind == 'send' else 'from'} rank "
                                 f"{call.peer}, but the pipeline has ranks 0 to {len(stages) - 1}")
            if call.kind == "wait" and calls[call.request].kind not in ("send", "recv"):
                raise ValueError(f"rank {rank} waits on call {call.request}, which is not a send or a receive")
    progress = [0] * len(stages)
    moved = True
    while moved:
        moved = False
        for rank, calls in enumerate(stages):
            while progress[rank] < len(calls):
                call = calls[progress[rank]]
                if call.kind == "wait" and (rank, call.request) not in _matches(stages, progress):
                    break
                progress[rank] += 1
                moved = True
    stuck = [_waiting(stages, rank, progress[rank]) for rank in range(len(stages))
             if progress[rank] < len(stages[rank])]
    return Stuck(tuple(stuck + _strays(stages, progress))) if stuck else None


def _strays(stages: Sequence[Sequence[Call]], progress: list[int]) -> list[str]:
    """"rank 3 sends 2 message(s) to rank 0, which never receives from rank 3": sends posted before the stages
    got stuck that nobody can match."""
    lines = []
    for rank, everything in enumerate(stages):
        calls = everything[:progress[rank]]
        for peer in sorted({call.peer for call in calls if call.kind == "send"}):
            sent = sum(1 for call in calls if call.kind == "send" and call.peer == peer)
            if not any(call.kind == "recv" and call.peer == rank for call in stages[peer]):
                lines.append(f"rank {rank} sends {sent} message(s) to rank {peer}, which never receives from "
                             f"rank {rank}")
    return lines
