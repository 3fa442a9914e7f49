"""Who waits for whom? Each rank keeps a record of the messages it posted and of the one it is blocked on.

A rank blocked on a point-to-point message uses no processor time, as does a rank blocked in a collective: it waits
in ``dist.recv`` or ``dist.send``, or in ``wait()`` on what ``isend``, ``irecv`` or ``batch_isend_irecv`` returned.
Its stack names a collective (:mod:`course.runtime.rank_stacks`), but not a message's peer. So each rank of
:func:`course.runtime.launch.launch` runs a :class:`Recorder`. It listens, through :mod:`course.runtime.intercept`
(the one listener on ``torch.distributed``), to every message the rank posts (``ProcessGroup.send`` and ``recv``, where
every point-to-point call ends) and to every ``Work.wait``. It keeps a :class:`Record`: the messages sent to and
received from each peer, and those the rank waits for now. Launch's ranks keep it in a small file that the launcher
reads (:func:`to_file`, :func:`read`); the grader's probes send it as a signed ``wait`` record as each wait begins
(:mod:`grader.inrank.probes`), read by the grader's hang report.
:func:`where` and :func:`wrong_peers` say it in the learner's terms: "rank 2 was waiting to receive from rank 3 (its
irecv number 1 from rank 3; rank 3 had sent it 0)", "rank 3 sent 2 message(s) to rank 0, which never receives from
rank 3". Taught in ``notebooks/00_start_here.ipynb`` with the hang report.

On GPUs the same torch.distributed calls reach nccl through the same methods, so the counts are the same. But
nccl's ``wait()`` only makes the GPU's stream wait, and returns at once (unless ``TORCH_NCCL_BLOCKING_WAIT=1``): the
rank then blocks at its next synchronisation (``.item()``, ``cuda.synchronize``), often spinning a processor. There
the record shows the messages posted, but seldom the wait, and the processor-time rule of
:mod:`course.runtime.progress` may not see the rank idle: the time limit then ends the run, with the same report.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from course.runtime import collective_names, intercept, observed

#: What a learner calls to send or receive one message; the messages are named after the outermost call.
CALLS = (*collective_names.functions(kind="p2p"), "batch_isend_irecv")
WAIT = "Work.wait"
SIZE = 64 * 1024  # bytes of the record file: the record of 64 ranks' counts fits many times over
_KEPT_WORKS = 4096  # work handles remembered until waited; past it, the completed ones and then the oldest go


@dataclass(frozen=True)
class Message:
    """One point-to-point message a rank posted."""

    direction: str  # "send" or "receive"
    peer: int  # the other rank, in the default group
    number: int  # 1 for this rank's first message in this direction with this peer, 2 for the next, ...
    call: str  # what the rank called: "irecv", "recv", "isend", "batch_isend_irecv", ...

    def describe(self) -> str:
        """``to receive from rank 3 (its irecv number 1 from rank 3)``."""
        to, verb = ("from", "receive") if self.direction == "receive" else ("to", "send")
        return f"to {verb} {to} rank {self.peer} (its {self.call} number {self.number} {to} rank {self.peer})"


@dataclass(frozen=True)
class Record:
    """What one rank's :class:`Recorder` last wrote: its messages so far, and those it is blocked on."""

    serial: int = 0  # grows at every message posted and every wait begun or ended: the rank's progress in messages
    sent: Mapping[int, int] = field(default_factory=dict)  # peer -> messages posted to it
    received: Mapping[int, int] = field(default_factory=dict)  # peer -> receives posted from it
    waiting: tuple[Message, ...] = ()  # what the rank's threads wait for now (a batch: several)

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON object (peers as text keys)."""
        return {"serial": self.serial, "sent": {str(k): v for k, v in self.sent.items()},
                "received": {str(k): v for k, v in self.received.items()},
                "waiting": [[m.direction, m.peer, m.number, m.call] for m in self.waiting]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """The record of :meth:`to_dict`'s object. Raises ValueError, KeyError or TypeError for another object."""
        waiting = tuple(Message(str(d), int(p), int(n), str(c)) for d, p, n, c in data["waiting"])
        if any(m.direction not in ("send", "receive") for m in waiting):
            raise ValueError(f"a message's direction must be send or receive, got {waiting}")
        return cls(int(data["serial"]), {int(k): int(v) for k, v in data["sent"].items()},
                   {int(k): int(v) for k, v in data["received"].items()}, waiting)


#: Told of every change to a rank's record: the record, and what changed ("posted", "waits", "waited").
Publish = Callable[[Record, str], None]


class Recorder:
    """In a rank: record every message posted and every wait on one, and tell ``publish`` of each change: launch's
    ranks write it to a file (:func:`to_file`), the grader's probes send a record when a wait begins.

    ``start()`` listens from then on; ``stop()`` stops. Never raises into the rank's code.
    """

    def __init__(self, publish: Publish) -> None:
        self._publish_to = publish
        self._lock = threading.Lock()
        self._local = threading.local()  # .call: the learner's call under way on this thread; .batch: its messages
        self._serial = 0
        self._sent: Counter[int] = Counter()
        self._received: Counter[int] = Counter()
        self._works: dict[int, tuple[Any, tuple[Message, ...]]] = {}  # id(work) -> (work, the messages it carries)
        self._waiting: dict[int, tuple[Message, ...]] = {}  # thread id -> the messages it waits for
        self._publish("posted")

    def start(self) -> None:
        intercept.INTERCEPTOR.add(self._listen, (*CALLS, *intercept.MESSAGES, WAIT))

    def stop(self) -> None:
        intercept.INTERCEPTOR.remove(self._listen)

    def _listen(self, call: intercept.Call) -> intercept.After | None:
        try:
            if call.name == WAIT:
                return self._wait(call.args[0] if call.args else None)
            if call.name in intercept.MESSAGES:
                return self._message(call)
            if not call.nested:  # the learner's own call: its messages are named after it
                return self._calling(call.name)
        except Exception:  # noqa: BLE001 - a record is evidence for a report; the rank's code must not pay for it
            return None
        return None

    def _calling(self, name: str) -> intercept.After:
        self._local.call, self._local.batch = name, []

        def returned(result: Any) -> Any:
            messages, self._local.call, self._local.batch = tuple(self._local.batch), None, None
            if name == "batch_isend_irecv" and isinstance(result, list):  # nccl: one handle for the whole batch
                with self._lock:
                    for work in result:
                        if id(work) not in self._works:
                            self._keep(work, messages)
            return result

        return returned

    def _message(self, call: intercept.Call) -> intercept.After:
        group, peer = observed.outer(call.args[0]), call.args[2]  # an observed group's messages go by its real one
        try:
            peer = dist.get_global_rank(group, peer)
        except (RuntimeError, ValueError, TypeError):
            pass  # a group the default one does not know: its own rank numbers
        send = call.name == "ProcessGroup.send"
        counts = self._sent if send else self._received
        with self._lock:
            counts[peer] += 1
            name = getattr(self._local, "call", None) or call.name
            message = Message("send" if send else "receive", peer, counts[peer], name)
            if getattr(self._local, "batch", None) is not None:
                self._local.batch.append(message)
            self._serial += 1
            self._publish("posted")

        def posted(work: Any) -> Any:
            if work is not None:
                with self._lock:
                    self._keep(work, (message,))
            return work

        return posted

    def _keep(self, work: Any, messages: tuple[Message, ...]) -> None:
        if len(self._works) >= _KEPT_WORKS:
            done = [key for key, (kept, _) in self._works.items() if _completed(kept)]
            for key in done or list(self._works)[:_KEPT_WORKS // 2]:
                del self._works[key]
        self._works[id(work)] = (work, messages)  # the work is held: its id is not reused while it is here

    def _wait(self, work: Any) -> intercept.After | None:
        thread = threading.get_ident()
        with self._lock:
            kept = self._works.pop(id(work), None)
            if kept is None or kept[0] is not work:
                return None  # a collective's handle, or one waited before
            self._waiting[thread] = kept[1]
            self._serial += 1
            self._publish("waits")

        def waited(result: Any) -> Any:
            with self._lock:
                self._waiting.pop(thread, None)
                self._serial += 1
                self._publish("waited")
            return result

        return waited

    def _publish(self, change: str) -> None:
        """Tell ``publish`` of the record now (with the lock held)."""
        waiting = tuple(m for messages in self._waiting.values() for m in messages)
        try:
            self._publish_to(Record(self._serial, dict(self._sent), dict(self._received), waiting), change)
        except Exception:  # noqa: BLE001 - evidence for a report: the rank's code must not pay for it
            pass


def to_file(path: str) -> Publish:
    """A :data:`Publish` that keeps the record in the file ``path`` (JSON, then a newline), for :func:`read`."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        kept = mmap.mmap(fd, SIZE)  # a write is a memory copy: no system call per message
    finally:
        os.close(fd)

    def write(record: Record, change: str) -> None:
        text = json.dumps(record.to_dict()).encode() + b"\n"
        if len(text) <= SIZE:
            kept[:len(text)] = text

    return write


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - a handle that cannot say is kept
        return False


def read(path: str) -> Record | None:
    """The record a :class:`Recorder` keeps in ``path``, or None (none yet, or being written)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(SIZE).split(b"\n", 1)[0]
        return Record.from_dict(json.loads(text))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def where(rank: int, records: Mapping[int, Record]) -> str | None:
    """Where ``rank`` waits on messages, from every rank's record: ``to receive from rank 3 (its irecv number 1
    from rank 3; rank 3 had sent it 0)``; None if it waits on none."""
    record = records.get(rank)
    if record is None or not record.waiting:
        return None
    parts = []
    for message in record.waiting:
        peer = records.get(message.peer)
        text = message.describe()
        if peer is not None and message.direction == "receive" and peer.sent.get(rank, 0) < message.number:
            text = f"{text[:-1]}; rank {message.peer} had sent it {peer.sent.get(rank, 0)})"
        elif peer is not None and message.direction == "send" and peer.received.get(rank, 0) < message.number:
            text = f"{text[:-1]}; rank {message.peer} had posted {peer.received.get(rank, 0)} receive(s) from it)"
        parts.append(text)
    return " and ".join(parts)


def wrong_peers(records: Mapping[int, Record]) -> list[str]:
    """Messages sent to a rank that never receives from the sender: ``rank 3 sent 2 message(s) to rank 0, which
    never receives from rank 3``, for each such pair in rank order."""
    found = []
    for sender, record in sorted(records.items()):
        for peer, count in sorted(record.sent.items()):
            if peer in records and count > 0 and records[peer].received.get(sender, 0) == 0:
                found.append(f"rank {sender} sent {count} message(s) to rank {peer}, which never receives from "
                             f"rank {sender}")
    return found
