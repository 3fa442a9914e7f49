"""NCCL's rules, kept on CPU: code that gloo lets pass but that would fail or hang on GPUs fails here, at its line.

Gloo is lenient where NCCL is not. Under :mod:`course.runtime.observed`, a rank that breaks one of these rules gets
:class:`NcclRuleError`, naming the rule, what was expected and what came, the learner's line, and the fix:

* ``device``: every tensor of a call is on the rank's device (``cuda:<local_rank>`` on GPUs; emulated ranks use the
  CPU, and a test may declare another device with :func:`declare_device`).
* ``order``: messages between two ranks match in the order they were posted. NCCL runs the sends and receives
  between two ranks in order, so rank A's k-th send to B meets B's k-th receive from A: same size, same dtype
  (:mod:`course.runtime.message_headers`). A receive from any source (``src=None``) does not exist on NCCL.
* ``threads``: a group is used by one thread at a time. A call issued while another thread's call on the same group
  is still in flight would be ordered differently on each rank.
* ``agreement``: every rank issues the same collectives in the same order, with the same shapes, dtypes and roots
  (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks at every call). Here each rank notes a signature per collective
  and folds it into a running hash of all its collectives so far. After its 1st, 2nd, 4th, ... 64th collective and
  then every 64th it publishes that hash, with the signatures since the last check, through the store, and compares
  with the ranks that have already published: a few store round trips per 64 calls, not one per call. Since the
  hash covers every call, a difference at any call (the 5th, between two checks) is caught at the next check, and
  each group checks once more at its end (:func:`settle`): as it is destroyed (``destroy_process_group``), or as
  the rank's function (:func:`course.runtime.launch.launch`) or script (the grader's) returns. So none goes
  unseen. The message names the first call that differs and what each rank issued there.

Taught in ``notebooks/08_tensor_pipeline.ipynb`` (the pipeline's sends and receives).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import Counter
from typing import Any

import torch

from course import world
from course.runtime import message_headers
from course.runtime.message_headers import NcclRuleError, at
from course.runtime.observed_record import Record

CHECK_EVERY = 64  # collectives between two agreement checks, after the first ones (1, 2, 4, ..., 64)
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_SHAPED = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
_DECLARED: list[torch.device] = []


def declare_device(device: str | torch.device | None) -> None:
    """Declare this rank's device for the ``device`` rule (``None``: the one :mod:`course.world` picks)."""
    _DECLARED[:] = [torch.device(device)] if device is not None else []


class Rules:
    """The rules for one observed group; :meth:`before` checks a call, :meth:`issue` runs it on the real group."""

    def __init__(self, group: Any, store: Any, enforce: bool) -> None:
        self.group, self.store, self.enforce = group, store, enforce
        self._lock = threading.Lock()
        self._found_device: torch.device | None = None
        self._in_flight: list[tuple[threading.Thread, Any, Record]] = []
        self._sent: Counter[tuple[int, int]] = Counter()  # (group rank, tag) -> messages sent to it with that tag
        self._received: Counter[tuple[int, int]] = Counter()
        self._inboxes: dict[tuple[int, int], message_headers.Inbox] = {}  # (peer, tag) -> checks its headers
        self._signatures: list[list[str]] = []  # collectives since the last agreement check: [signature, where]
        self._collectives = 0
        self._hash = ""  # running hash of every collective's signature so far
        self._checks: list[int] = []  # the collective numbers this rank published its hash at
        self.broken: NcclRuleError | None = None

    def before(self, record: Record, tensors: list[torch.Tensor], args: tuple) -> None:
        """Raise :class:`NcclRuleError` if the call about to be issued breaks a rule."""
        if not self.enforce:
            return
        if self.broken is not None:
            raise self.broken
        self._check_device(record, tensors)
        self._check_thread(record)
        if record.method == "recv_anysource":
            raise NcclRuleError("order", f"a receive from any source{at(record)}: NCCL has none. Fix: name the "
                                "sender, dist.recv(tensor, src=...).")
        if record.kind == "collective":
            self._note_collective(record, args)

    def _device(self) -> torch.device:
        """The rank's device: a declared one, else found once, at the group's first call (every call asks)."""
        if _DECLARED:
            return _DECLARED[0]
        if self._found_device is None:
            self._found_device = world.device_for(int(os.environ.get("LOCAL_RANK", "0")))
        return self._found_device

    def _check_device(self, record: Record, tensors: list[torch.Tensor]) -> None:
        device = self._device()
        for tensor in tensors:
            if tensor.device.type != device.type or (device.index is not None and tensor.device != device):
                raise NcclRuleError(
                    "device", f"{record.api}{at(record)} got a tensor on {tensor.device}, expected one on this "
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
            self._break(NcclRuleError(
                "threads", f"{record.api}{at(record)} was issued from thread {me.name!r} while "
                f"{earlier.api}{at(earlier)}, issued from thread {thread.name!r}, was still in flight on the same "
                "process group. NCCL's communicator serves one thread at a time, and two threads would order the "
                "calls differently on each rank. Fix: issue every call of a group from one thread."))

    def _break(self, error: NcclRuleError) -> None:
        """Raise ``error`` here, and in every thread that waits for a message of this group or calls it later: the
        rank fails, not only the thread that broke the rule."""
        self.broken = error
        for _, work, _ in self._in_flight:
            message_headers.fail(work, error)
        raise error

    def issue(self, record: Record, method: str, args: tuple, kwargs: dict) -> Any:
        """Run the call on the real group (messages with their headers); returns its work handle."""
        inner = self.group.inner
        if not self.enforce or record.kind != "p2p" or method == "recv_anysource":
            work = getattr(inner, method)(*args, **kwargs)
        elif method == "send":
            channel = (args[1], record.tag or 0)
            self._sent[channel] += 1
            work = message_headers.send(inner, record, self._sent[channel], args, kwargs)
        else:
            channel = (args[1], record.tag or 0)
            self._received[channel] += 1
            work = message_headers.recv(inner, record, self._received[channel], args, kwargs, self._inboxes)
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
            self._hash = hashlib.blake2b(f"{self._hash}|{signature}".encode(), digest_size=8).hexdigest()
            self._collectives += 1
            number = self._collectives
            if number % CHECK_EVERY != 0 and (number & (number - 1)) != 0:
                return
        self.agree()

    def agree(self) -> None:
        """Publish this rank's running hash at its latest collective, with the signatures since its last check, and
        compare with the ranks that have already published there (:class:`NcclRuleError` naming the first call
        that differs). Called at the sampled collectives, and by :func:`settle` at the end."""
        with self._lock:
            number, mine, self._signatures = self._collectives, self._signatures, []
            if not self.enforce or not number or (self._checks and self._checks[-1] == number):
                return
            self._checks.append(number)
            rank = self.group.rank()
            self.store.set(f"observed-agree/{number}/{rank}", json.dumps({"hash": self._hash, "calls": mine}))
        for other in range(self.group.size()):
            key = f"observed-agree/{number}/{other}"
            if other != rank and self.store.check([key]) and json.loads(self.store.get(key))["hash"] != self._hash:
                raise self._disagreement(rank, other)

    def _disagreement(self, rank: int, other: int) -> NcclRuleError:
        """The first collective whose signature differs between this rank and ``other`` (both published at every
        check up to the one that failed), as a rule's error."""
        index = 0
        for number in self._checks:
            keys = [f"observed-agree/{number}/{who}" for who in (rank, other)]
            if not self.store.check(keys):
                break  # the other rank never reached this check
            mine, theirs = (json.loads(self.store.get(key))["calls"] for key in keys)
            for offset, (signature, where) in enumerate(mine):
                got = theirs[offset] if offset < len(theirs) else ["nothing", ""]
                if got[0] != signature:
                    return NcclRuleError(
                        "agreement", f"collective number {index + offset + 1} on this process group differs between "
                        f"ranks: rank {rank} issued {signature}{f' (at {where})' if where else ''}, but rank {other} "
                        f"issued {got[0]}{f' (at {got[1]})' if got[1] else ''}. On GPUs NCCL would hang or mix up the "
                        "data. Fix: every rank must call the same collectives in the same order, with the same "
                        "shapes, dtypes and root.")
            index += len(mine)
        return NcclRuleError("agreement", f"the collectives of rank {rank} and rank {other} differ (their running "
                             "hashes do), but no single call could be named. Fix: every rank must call the same "
                             "collectives in the same order, with the same shapes, dtypes and root.")


def settle(groups: list[Any]) -> None:
    """Check the agreement of each observed group in ``groups`` once more, at its last collective: a difference
    after the last sampled check is caught too. Called as a group is destroyed and as a rank's function or script
    returns (:func:`course.runtime.observed.settle`).

    It never waits: each rank compares with the ranks that reached the same collective before it, so the last to
    arrive names the difference, and a rank that crashed or left early is not waited for. A store that can no
    longer be reached (its host, a rank of the script's own group, has left) leaves nothing to compare with.

    Raises:
        NcclRuleError: as the sampled checks do, naming the first call that differs.
    """
    for group in groups:
        rules = getattr(group, "rules", None)
        if isinstance(rules, Rules) and rules.broken is None:  # a broken rule was raised already
            try:
                rules.agree()
            except NcclRuleError:
                raise
            except RuntimeError:  # the store is gone (torch's DistNetworkError): no peer left to compare with
                continue


def _done(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:  # a failed call: it is over
        return True
