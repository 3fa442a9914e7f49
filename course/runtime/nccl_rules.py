"""NCCL's rules, kept on CPU: code that gloo lets pass but that would fail or hang on GPUs fails here, at its line.

Gloo is lenient where NCCL is not. Under :mod:`course.runtime.observed`, a rank that breaks one of these rules gets
:class:`NcclRuleError`, naming the rule, what was expected and what came, the learner's line, and the fix:

* ``device``: every tensor of a call is on the rank's device (``cuda:<local_rank>`` on GPUs; emulated ranks use the
  CPU, and a test may declare another device with :func:`declare_device`).
* ``order``: messages between two ranks match in the order they were posted. NCCL ignores tags and runs the sends
  and receives between two ranks in order, so rank A's k-th send to B meets B's k-th receive from A: same shape,
  same dtype. Each send carries a small header (its number, shape, dtype and line) that the receive checks when it
  is waited for. A receive from any source (``src=None``) does not exist on NCCL.
* ``threads``: a group is used by one thread at a time. A call issued while another thread's call on the same group
  is still in flight would be ordered differently on each rank.
* ``agreement``: every rank issues the same collectives in the same order, with the same shapes, dtypes and roots
  (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks at every call). Here each rank notes a signature per collective,
  and compares the list with the other ranks' through the store after its 1st, 2nd, 4th, ... 64th collective and
  then every 64th: a few store round trips per 64 calls, not one per call.

Taught in ``notebooks/08_tensor_pipeline.ipynb`` (the pipeline's sends and receives).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from typing import Any

import torch

from course import world
from course.runtime import intercept
from course.runtime.observed_record import Record

HEADER_TAG = 0x7E0D0000  # the tag of the headers: far from any tag a learner picks
_DIMS = 6  # a header holds up to this many dimensions of the shape (more: their product in the last slot)
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
CHECK_EVERY = 64  # collectives between two agreement checks, after the first ones (1, 2, 4, ..., 64)
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_SHAPED = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
_DECLARED: list[torch.device] = []


class NcclRuleError(RuntimeError):
    """A call that NCCL forbids; ``rule`` names the rule (see the module doc)."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"NCCL rule '{rule}': {message}")


def declare_device(device: str | torch.device | None) -> None:
    """Declare this rank's device for the ``device`` rule (``None``: the one :mod:`course.world` picks)."""
    _DECLARED[:] = [torch.device(device)] if device is not None else []


def _rank_device() -> torch.device:
    if _DECLARED:
        return _DECLARED[0]
    return world.device_for(int(os.environ.get("LOCAL_RANK", "0")))


def _at(record: Record) -> str:
    return f" (at {record.where})" if record.where else ""


class Rules:
    """The rules for one observed group; :meth:`before` checks a call, :meth:`issue` runs it on the real group."""

    def __init__(self, group: Any, store: Any, enforce: bool) -> None:
        self.group, self.store, self.enforce = group, store, enforce
        self._lock = threading.Lock()
        self._in_flight: list[tuple[threading.Thread, Any, Record]] = []
        self._sent: Counter[int] = Counter()  # group rank -> messages sent to it
        self._received: Counter[int] = Counter()
        self._signatures: list[list[str]] = []  # collectives since the last agreement check: [signature, where]
        self._collectives = 0

    def before(self, record: Record, tensors: list[torch.Tensor], args: tuple) -> None:
        """Raise :class:`NcclRuleError` if the call about to be issued breaks a rule."""
        if not self.enforce:
            return
        self._check_device(record, tensors)
        self._check_thread(record)
        if record.method == "recv_anysource":
            raise NcclRuleError("order", f"a receive from any source{_at(record)}: NCCL has none. Fix: name the "
                                "sender, dist.recv(tensor, src=...).")
        if record.kind == "collective":
            self._note_collective(record, args)

    def _check_device(self, record: Record, tensors: list[torch.Tensor]) -> None:
        device = _rank_device()
        for tensor in tensors:
            if tensor.device.type != device.type or (device.index is not None and tensor.device != device):
                raise NcclRuleError(
                    "device", f"{record.api}{_at(record)} got a tensor on {tensor.device}, expected one on this "
                    f"rank's device, {device}. On GPUs NCCL only moves tensors on the rank's own GPU. Fix: "
                    "create it there, or move it first: tensor.to(rank.device).")

    def _check_thread(self, record: Record) -> None:
        me = threading.current_thread()
        with self._lock:
            self._in_flight = [(thread, work, earlier) for thread, work, earlier in self._in_flight
                               if thread.is_alive() and not _done(work)]
            other = next(((thread, earlier) for thread, _, earlier in self._in_flight if thread is not me), None)
        if other is not None:
            thread, earlier = other
            raise NcclRuleError(
                "threads", f"{record.api}{_at(record)} was issued from thread {me.name!r} while "
                f"{earlier.api}{_at(earlier)}, issued from thread {thread.name!r}, was still in flight on the same "
                "process group. NCCL's communicator serves one thread at a time, and two threads would order the "
                "calls differently on each rank. Fix: issue every call of a group from one thread.")

    def issue(self, record: Record, method: str, args: tuple, kwargs: dict) -> Any:
        """Run the call on the real group (messages with their headers); returns its work handle."""
        inner = self.group.inner
        if not self.enforce or record.kind != "p2p" or method == "recv_anysource":
            work = getattr(inner, method)(*args, **kwargs)
        elif method == "send":
            self._sent[args[1]] += 1
            header = _header(record, self._sent[args[1]])
            sent = intercept.original("ProcessGroup.send")(inner, [header], args[1], HEADER_TAG)
            work = _Checked(inner.send(*args, **kwargs), None, header, sent)
        else:
            self._received[args[1]] += 1
            header = torch.zeros(_HEADER_LENGTH, dtype=torch.int64)
            heard = intercept.original("ProcessGroup.recv")(inner, [header], args[1], HEADER_TAG)
            work = _Checked(inner.recv(*args, **kwargs), record, header, heard, self._received[args[1]])
        if self.enforce and work is not None:
            with self._lock:
                self._in_flight.append((threading.current_thread(), work, record))
        return work

    def _note_collective(self, record: Record, args: tuple) -> None:
        signature = record.op
        if record.op in _SHAPED:
            signature = record.signature()
        if record.op in _ROOTED and len(args) > 1 and hasattr(args[1], "rootRank"):
            signature += f" from root {args[1].rootRank}"
        with self._lock:
            self._signatures.append([signature, record.where])
            self._collectives += 1
            number = self._collectives
            due = number % CHECK_EVERY == 0 or (number & (number - 1)) == 0
            if not due:
                return
            mine, self._signatures = self._signatures, []
        self._agree(number, mine)

    def _agree(self, number: int, mine: list[list[str]]) -> None:
        """Publish this rank's signatures up to collective ``number``; compare with the ranks that already have."""
        rank = self.group.rank()
        self.store.set(f"observed-agree/{number}/{rank}", json.dumps(mine))
        for other in range(self.group.size()):
            key = f"observed-agree/{number}/{other}"
            if other == rank or not self.store.check([key]):
                continue
            theirs = json.loads(self.store.get(key))
            for index, (signature, where) in enumerate(mine):
                if index >= len(theirs) or theirs[index][0] != signature:
                    got = theirs[index] if index < len(theirs) else ["nothing", ""]
                    call = number - len(mine) + index + 1
                    raise NcclRuleError(
                        "agreement", f"collective number {call} on this process group differs between ranks: "
                        f"rank {rank} issued {signature}{f' (at {where})' if where else ''}, but rank {other} issued "
                        f"{got[0]}{f' (at {got[1]})' if got[1] else ''}. On GPUs NCCL would hang or mix up the data. "
                        "Fix: every rank must call the same collectives in the same order, with the same shapes, "
                        "dtypes and root.")


def _done(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:  # a failed call: it is over
        return True


_HEADER_LENGTH = 6 + _DIMS  # number, dtype, line, tag, numel, ndim, dims...


def _header(record: Record, number: int) -> torch.Tensor:
    """What a send tells its receive: its number in this direction, dtype, line and shape."""
    shape = list(record.shapes[0]) if record.shapes else []
    if len(shape) > _DIMS:
        shape = shape[:_DIMS - 1] + [int(torch.tensor(shape[_DIMS - 1:]).prod())]
    dtype = _DTYPES.index(_dtype(record.dtype)) if _dtype(record.dtype) in _DTYPES else -1
    line = int(record.where.rsplit(":", 1)[1]) if ":" in record.where else 0
    numel = int(torch.Size(record.shapes[0]).numel()) if record.shapes else 0
    values = [number, dtype, line, record.tag or 0, numel, len(record.shapes[0]) if record.shapes else 0, *shape]
    return torch.tensor(values + [0] * (_HEADER_LENGTH - len(values)), dtype=torch.int64)


def _dtype(name: str) -> torch.dtype | None:
    found = getattr(torch, name, None)
    return found if isinstance(found, torch.dtype) else None


def _describe(header: list[int]) -> str:
    dims = header[6:6 + min(header[5], _DIMS)]
    dtype = str(_DTYPES[header[1]]).removeprefix("torch.") if 0 <= header[1] < len(_DTYPES) else "a tensor"
    tag = f" with tag {header[3]}" if header[3] else ""
    return f"{dtype}[{', '.join(map(str, dims))}]{tag}"


class _Checked(torch.distributed.Work):
    """A message's work handle: a receive's ``wait()`` also checks the header its send carried (see ``order``)."""

    def __init__(self, work: Any, record: Record | None, header: torch.Tensor, header_work: Any,
                 number: int = 0) -> None:
        super().__init__()
        self.work, self.record, self.header, self.header_work, self.number = work, record, header, header_work, number
        self.checked = record is None

    def wait(self, timeout: Any = None) -> bool:
        try:
            done = self.work.wait() if timeout is None else self.work.wait(timeout)
        except RuntimeError:
            self._check(after_error=True)
            raise
        self._check()
        return done

    def _check(self, after_error: bool = False) -> None:
        if self.checked:
            self.header_work.wait()
            return
        self.checked = True
        self.header_work.wait()
        record, header = self.record, self.header.tolist()
        tensor_header = _header(record, self.number).tolist()
        if header[1] == tensor_header[1] and header[3:5] == tensor_header[3:5]:  # dtype, tag and size: NCCL's match
            return
        sender = f"rank {record.peer}"
        raise NcclRuleError(
            "order", f"receive number {self.number} of this rank from {sender}{_at(record)} expected "
            f"{_describe(tensor_header)}, but {sender}'s send number {header[0]} (its line {header[2]}) carries "
            f"{_describe(header)}. NCCL ignores tags and matches the sends and receives between two ranks in the "
            "order each posted them, by size and dtype. Fix: post the receives in the order the sender posts its sends, each the "
            "sender's shape and dtype.")

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def is_success(self) -> bool:
        return bool(self.work.is_success())

    def exception(self) -> Any:
        return self.work.exception()

    def source_rank(self) -> int:
        return self.work.source_rank()

    def result(self) -> Any:
        return self.work.result()

    def get_future(self) -> Any:
        return self.work.get_future()

    def synchronize(self) -> None:
        self.work.synchronize()
