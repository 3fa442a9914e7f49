"""NCCL's ``order`` rule for messages: rank A's k-th send to rank B meets B's k-th receive from A, by size and dtype.

NCCL runs the messages between two ranks in the order each rank posted them. Code whose receives come in another
order than the sends makes gloo abort the rank ("Received data size doesn't match expected size"), or mixes up
data when the sizes agree; on GPUs it fails or hangs. Gloo also matches by tag, and NCCL ignores tags: the check
follows gloo there, per tag (the course's own tagged protocol runs only on gloo, and batches its messages on
NCCL: ``course.collectives.allreduce.TAGGED_BACKENDS``). Under
:mod:`course.runtime.observed` each send first sends a small header: its number, dtype, size, shape, tag and the
learner's line. The receive posts only the header's receive at first; when the header arrives (a thread per peer
waits for them, in order) it compares, and posts the real receive only if the two agree, so gloo never sees a
mismatched one. ``wait()`` on the
receive raises :class:`NcclRuleError` if they disagree, naming both lines. The headers are the messages that
:mod:`course.runtime.intercept`'s listeners (the hang report's :mod:`course.runtime.waits`, the grader's probes) hear.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from course.runtime import intercept
from course.runtime.observed_record import Record

HEADER_TAG = 0x7E0D0000  # the headers' tags start here (plus the message's tag): far from any tag a learner picks
_DIMS = 6  # a header holds up to this many dimensions of the shape (more: their product in the last slot)
_LENGTH = 6 + _DIMS  # number, dtype, line, tag, numel, ndim, dims...
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


class NcclRuleError(RuntimeError):
    """A call that NCCL forbids; ``rule`` names the rule (see :mod:`course.runtime.nccl_rules`)."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"NCCL rule '{rule}': {message}")


def at(record: Record) -> str:
    """`` (at file.py:12)``, the learner's line of ``record``, or nothing."""
    return f" (at {record.where})" if record.where else ""


def send(inner: Any, record: Record, number: int, args: tuple, kwargs: dict) -> dist.Work:
    """Send ``number``'s header, then the message, on the real group ``inner``."""
    header = _header(record, number)
    heard = inner.send([header], args[1], HEADER_TAG + (record.tag or 0))  # the one the listeners hear
    return _Sent(intercept.original("ProcessGroup.send")(inner, *args, **kwargs), heard, header)


def recv(inner: Any, record: Record, number: int, args: tuple, kwargs: dict, inboxes: dict[tuple[int, int], Inbox]
         ) -> dist.Work:
    """Receive ``number``'s header; the message itself once the header agrees (see the module doc). ``inboxes``:
    the group's, by peer and tag."""
    header = torch.zeros(_LENGTH, dtype=torch.int64)
    targets, landing = args[0], args[0]
    if _HELD:  # the message lands aside; the learner's tensors hold poison until wait()
        landing = [torch.empty_like(tensor) for tensor in targets]
        with torch.no_grad():
            for tensor in targets:
                tensor.fill_(_poison(tensor.dtype))
    received = _Received(inner.recv([header], args[1], HEADER_TAG + (record.tag or 0)), header, record, number,
                         lambda: intercept.original("ProcessGroup.recv")(inner, landing, *args[1:], **kwargs))
    received.deliver = (landing, targets) if landing is not targets else None
    channel = (args[1], record.tag or 0)
    if channel not in inboxes:
        inboxes[channel] = Inbox()
    inboxes[channel].put(received)
    return received


class Inbox:
    """The headers from one peer with one tag, checked in the order they come by a thread of their own: a receive
    never waits for a header from another rank, or with another tag."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Received] = queue.SimpleQueue()
        threading.Thread(target=self._check, name="course-message-headers", daemon=True).start()

    def put(self, received: _Received) -> None:
        self._queue.put(received)

    def _check(self) -> None:
        wait = intercept.original("Work.wait")  # not the learner's wait: the hang report must not count it
        while True:
            received = self._queue.get()
            try:
                wait(received.heard)
            except BaseException as error:  # noqa: BLE001 - the group went down: told to the learner's wait()
                received.error = error
                received.checked.set()
                continue
            received.arrived()


_HELD: list[bool] = []


@contextmanager
def delivered_at_wait() -> Iterator[None]:
    """Inside the ``with`` block, a received message reaches the learner's tensor only when its ``wait()`` returns,
    on the thread that waits; until then the tensor holds NaN (integers: their largest value). So code that reads a
    tensor before its ``irecv`` completed is wrong on every run, as it would be on GPUs (where the data lands
    whenever the GPU gets to it), not only on a slow machine. Used by the pipeline-runner lab's checker."""
    _HELD.append(True)
    try:
        yield
    finally:
        _HELD.pop()


def _poison(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return True if dtype == torch.bool else torch.iinfo(dtype).max


def fail(work: Any, error: BaseException) -> None:
    """Make ``wait()`` on ``work``, a receive not yet checked, raise ``error``."""
    if isinstance(work, _Received) and not work.checked.is_set():
        work.error = error
        work.checked.set()


def _header(record: Record, number: int) -> torch.Tensor:
    """What a send tells its receive: its number in this direction, dtype, line, tag, size and shape."""
    shape = list(record.shapes[0]) if record.shapes else []
    numel = int(torch.Size(shape).numel()) if record.shapes else 0
    if len(shape) > _DIMS:
        shape = shape[:_DIMS - 1] + [int(torch.Size(shape[_DIMS - 1:]).numel())]
    dtype = getattr(torch, record.dtype, None)
    code = _DTYPES.index(dtype) if dtype in _DTYPES else -1
    line = int(record.where.rsplit(":", 1)[1]) if ":" in record.where else 0
    values = [number, code, line, record.tag or 0, numel, len(record.shapes[0]) if record.shapes else 0, *shape]
    return torch.tensor(values + [0] * (_LENGTH - len(values)), dtype=torch.int64)


def _describe(header: list[int]) -> str:
    """``float32[2, 4] with tag 3``."""
    dims = header[6:6 + min(header[5], _DIMS)]
    dtype = str(_DTYPES[header[1]]).removeprefix("torch.") if 0 <= header[1] < len(_DTYPES) else "a tensor"
    tag = f" with tag {header[3]}" if header[3] else ""
    return f"{dtype}[{', '.join(map(str, dims))}]{tag}"


def _disagreement(record: Record, number: int, sent: list[int]) -> NcclRuleError | None:
    mine = _header(record, number).tolist()
    if sent[1] == mine[1] and sent[3:5] == mine[3:5]:  # dtype, tag and size: what NCCL matches
        return None
    sender = f"rank {record.peer}"
    return NcclRuleError(
        "order", f"receive number {number} of this rank from {sender}{at(record)} expected {_describe(mine)}, but "
        f"{sender}'s send number {sent[0]} (its line {sent[2]}) carries {_describe(sent)}. NCCL matches the "
        "sends and receives between two ranks in the order each posted them, by size and dtype. Fix: "
        "post the receives in the order the sender posts its sends, each the sender's size and dtype.")


class _Sent(dist.Work):
    """A send's handle: done when its header and the message are."""

    def __init__(self, work: Any, heard: Any, header: torch.Tensor) -> None:
        super().__init__()
        self.work, self.heard, self.header = work, heard, header

    def wait(self, timeout: Any = None) -> bool:
        self.heard.wait()
        return self.work.wait() if timeout is None else self.work.wait(timeout)

    def is_completed(self) -> bool:
        return bool(self.heard.is_completed() and self.work.is_completed())

    def source_rank(self) -> int:
        return self.work.source_rank()

    def get_future(self) -> Any:
        return self.work.get_future()


class _Received(dist.Work):
    """A receive's handle: its header first, checked on arrival; then the message (see the module doc)."""

    def __init__(self, heard: Any, header: torch.Tensor, record: Record, number: int, post: Any) -> None:
        super().__init__()
        self.heard, self.header, self.record, self.number, self.post = heard, header, record, number, post
        self.work: Any = None
        self.deliver: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # (landing, the learner's)
        self.error: BaseException | None = None
        self.checked = threading.Event()

    def arrived(self) -> None:
        """On its inbox's thread, as the header lands: post the receive, or note why not."""
        try:
            self.error = _disagreement(self.record, self.number, self.header.tolist())
            if self.error is None:
                self.work = self.post()
        except BaseException as error:  # noqa: BLE001 - told to the learner's wait(), never lost on the inbox's
            self.error = error
        finally:
            self.checked.set()

    def wait(self, timeout: Any = None) -> bool:
        with intercept.announced("Work.wait", self.heard):  # a wait for the message: the hang report sees it
            self.checked.wait()
        if self.error is not None:
            raise self.error
        done = self.work.wait() if timeout is None else self.work.wait(timeout)
        if self.deliver is not None:
            landing, targets = self.deliver
            self.deliver = None
            with torch.no_grad():
                for target, arrived in zip(targets, landing, strict=True):
                    target.copy_(arrived)
        return done

    def is_completed(self) -> bool:  # a held message is complete once waited: until then, the tensor is poison
        return self.checked.is_set() and (self.error is not None or (self.deliver is None and
                                                                     bool(self.work.is_completed())))

    def source_rank(self) -> int:
        return self.record.peer if self.record.peer is not None else -1

    def get_future(self) -> Any:
        self.wait()
        return self.work.get_future()
