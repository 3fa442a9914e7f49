"""Catch a send and its receive of different sizes before gloo does (gloo aborts the process with no Python error).

``with matched_sizes():`` watches every message the process group sends or receives
(:func:`course.runtime.observed.listening`: ``send``, ``isend`` imported by name, ``batch_isend_irecv``, a group's
own ``send``): before the k-th message from rank a to rank b goes out, rank a writes its element count to the
process group's store under ``a->b/k``; before rank b posts its k-th receive from a, it reads that count and raises
:class:`SizeMismatch` if its buffer holds a different number of elements. The message is then never posted, so no
rank is aborted and the lab can say which message disagreed. On a group of torch's own (nccl on GPUs) it wraps
``torch.distributed``'s ``send``/``isend`` and ``recv``/``irecv`` by name instead. Used by the ring lab
(:mod:`grader.labs.ring`).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course.runtime import collective_names, intercept, observed
from course.runtime.observed_record import Record

_SENDS, _RECEIVES = collective_names.functions("send"), collective_names.functions("recv")


class SizeMismatch(Exception):
    """A receive whose buffer's size differs from what its sender sends (``index``: the k-th such message)."""

    def __init__(self, sender: int, receiver: int, index: int, sent: int, expected: int) -> None:
        super().__init__(f"rank {sender}'s message {index + 1} to rank {receiver} has {sent} elements; rank "
                         f"{receiver} receives it into {expected}")
        self.sender, self.receiver, self.index, self.sent, self.expected = sender, receiver, index, sent, expected


def _peer(args: tuple, kwargs: dict, key: str) -> int | None:
    peer = args[1] if len(args) > 1 else kwargs.get(key)
    return peer if isinstance(peer, int) else None


class _Sizes:
    """The element counts of one ``with matched_sizes()``'s messages, compared through the store."""

    def __init__(self, tag: str) -> None:
        self.store, self.rank, self.tag = c10d._get_default_store(), dist.get_rank(), tag
        self.counts: Counter = Counter()  # (sender, receiver) -> messages so far
        self.inside = threading.local()  # .depth: inside a wrapped call (torch's send calls isend)

    def check(self, sending: bool, peer: int, numel: int) -> None:
        """Publish (a send) or compare (a receive) the next message's element count with ``peer``."""
        pair = (self.rank, peer) if sending else (peer, self.rank)
        index = self.counts[pair]
        self.counts[pair] += 1
        key = f"course-labs-size/{self.tag}/{pair[0]}->{pair[1]}/{index}"
        if sending:
            self.store.set(key, str(numel))
        elif (sent := int(self.store.get(key))) != numel:
            raise SizeMismatch(peer, self.rank, index, sent, numel)

    def listen(self, record: Record) -> None:
        """On the process group: every message, checked before it is posted."""
        if record.kind == "p2p" and record.peer is not None:
            self.check(record.op == "send", record.peer, sum(math.prod(shape) for shape in record.shapes))

    def wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """On a group of torch's own: the function ``name``, its messages checked (the outer call counts: torch's
        send calls isend)."""
        sending, inside = name in _SENDS, self.inside

        @functools.wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args else kwargs.get("tensor")
            peer = _peer(args, kwargs, "dst" if sending else "src")
            if getattr(inside, "depth", 0) or peer is None or not isinstance(tensor, torch.Tensor):
                return original(*args, **kwargs)
            self.check(sending, peer, tensor.numel())
            inside.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth = 0
        return checked


@contextmanager
def matched_sizes(tag: str = "") -> Iterator[None]:
    """While open, every point-to-point message's size is compared with its receive's before it is posted.

    Messages are counted from 0 in each ``with``; every rank must use the same ``tag``, new for each ``with``."""
    sizes = _Sizes(tag)
    if observed.is_observed():
        with observed.listening(sizes.listen):
            yield
    else:
        with intercept.replacing(_SENDS + _RECEIVES, sizes.wrap):
            yield
