"""Catch a send and its receive of different sizes before gloo does (gloo aborts the process with no Python error).

``with matched_sizes():`` wraps ``torch.distributed``'s ``send``/``isend`` and ``recv``/``irecv``: before the
k-th message from rank a to rank b goes out, rank a writes its element count to the process group's store under
``a->b/k``; before rank b posts its k-th receive from a, it reads that count and raises :class:`SizeMismatch` if
its buffer holds a different number of elements. The message is then never posted, so no rank is aborted and the
lab can say which message disagreed. Used by the ring lab (:mod:`grader.labs.ring`).
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course.runtime import intercept

_SENDS, _RECEIVES = ("send", "isend"), ("recv", "irecv")


class SizeMismatch(Exception):
    """A receive whose buffer's size differs from what its sender sends (``index``: the k-th such message)."""

    def __init__(self, sender: int, receiver: int, index: int, sent: int, expected: int) -> None:
        super().__init__(f"rank {sender}'s message {index + 1} to rank {receiver} has {sent} elements; rank "
                         f"{receiver} receives it into {expected}")
        self.sender, self.receiver, self.index, self.sent, self.expected = sender, receiver, index, sent, expected


def _peer(args: tuple, kwargs: dict, key: str) -> int | None:
    peer = args[1] if len(args) > 1 else kwargs.get(key)
    return peer if isinstance(peer, int) else None


@contextmanager
def matched_sizes(tag: str = "") -> Iterator[None]:
    """While open, every point-to-point message's size is compared with its receive's before it is posted.

    Messages are counted from 0 in each ``with``; every rank must use the same ``tag``, new for each ``with``."""
    store = c10d._get_default_store()
    rank = dist.get_rank()
    counts: Counter = Counter()  # (sender, receiver) -> messages so far
    inside = threading.local()

    def wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        sending = name in _SENDS

        @functools.wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args else kwargs.get("tensor")
            peer = _peer(args, kwargs, "dst" if sending else "src")
            if getattr(inside, "depth", 0) or peer is None or not isinstance(tensor, torch.Tensor):
                return original(*args, **kwargs)  # torch's send calls isend: the outer call counts
            pair = (rank, peer) if sending else (peer, rank)
            index = counts[pair]
            counts[pair] += 1
            key = f"course-labs-size/{tag}/{pair[0]}->{pair[1]}/{index}"
            if sending:
                store.set(key, str(tensor.numel()))
            else:
                sent = int(store.get(key))
                if sent != tensor.numel():
                    raise SizeMismatch(peer, rank, index, sent, tensor.numel())
            inside.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth = 0
        return checked

    with intercept.replacing(_SENDS + _RECEIVES, wrap):
        yield
