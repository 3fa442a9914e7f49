"""Each allreduce as a *schedule*: the steps it takes, each a set of messages that travel at the same time.

A message says rank ``source`` sends chunk ``chunk`` of its vector (or all of it, :data:`WHOLE`) to rank
``dest``, which adds it to its own or overwrites its own. The schedules follow :mod:`course.collectives.allreduce`
step for step (its table holds each algorithm's schedule); :mod:`course.collectives.simulation` plays them in one
process and draws them. Taught in ``notebooks/04_allreduce.ipynb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A whole-tensor message (naive and tree move whole tensors, the ring moves chunks).
WHOLE = -1


@dataclass(frozen=True)
class Message:
    """Rank ``source`` sends chunk ``chunk`` (or the whole vector, ``WHOLE``) to rank ``dest``."""

    source: int
    dest: int
    chunk: int


@dataclass(frozen=True)
class Step:
    """Messages that travel at the same time; ``add`` True reduces into the receiver, False overwrites."""

    phase: str
    messages: tuple[Message, ...]
    add: bool


def ring_schedule(world_size: int) -> list[Step]:
    """Reduce-scatter then all-gather: at step t rank r sends chunk (r - t) % n to rank (r + 1) % n."""
    n = world_size
    return [Step("reduce-scatter" if t < n - 1 else "all-gather",
                 tuple(Message(r, (r + 1) % n, (r - t) % n) for r in range(n)), add=t < n - 1)
            for t in range(2 * (n - 1))]


def naive_schedule(world_size: int) -> list[Step]:
    """Everyone sends to rank 0 in turn (its one link takes one at a time), then rank 0 sends to each."""
    gather = [Step("gather to rank 0", (Message(r, 0, WHOLE),), add=True) for r in range(1, world_size)]
    broadcast = [Step("broadcast from rank 0", (Message(0, r, WHOLE),), add=False) for r in range(1, world_size)]
    return gather + broadcast


def tree_schedule(world_size: int) -> list[Step]:
    """Binomial tree: in round bit=1,2,4,.. ranks whose lowest set bit is ``bit`` send to ``rank - bit``;
    the broadcast replays those edges backwards."""
    n = world_size
    bits = [1 << k for k in range(math.ceil(math.log2(n)))] if n > 1 else []
    senders = {bit: [r for r in range(1, n) if r & -r == bit] for bit in bits}
    reduce = [Step("reduce up the tree", tuple(Message(r, r - bit, WHOLE) for r in senders[bit]), add=True)
              for bit in bits]
    broadcast = [Step("broadcast down the tree", tuple(Message(r - bit, r, WHOLE) for r in senders[bit]), add=False)
                 for bit in reversed(bits)]
    return reduce + broadcast
