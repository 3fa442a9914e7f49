"""One observation layer under ``torch.distributed``: every collective and message a rank issues, however reached.

Every ``torch.distributed`` call ends in a method of the process group: ``dist.all_reduce`` in
``group.allreduce``, ``dist.all_gather_single`` and ``all_gather_into_tensor`` in ``group.all_gather_single``,
``isend`` (imported by name or not) in ``group.send``, and so do ``batch_isend_irecv``, DeviceMesh, the functional
collectives, DDP's reducer and the course's own :class:`course.collectives.protocol.Comm`. :class:`ObservedGroup` is
a process group, a Python subclass of ``dist.ProcessGroup``, whose methods note a :class:`Record` of each call, tell
the listeners (:func:`listening`), enforce NCCL's rules (:mod:`course.runtime.nccl_rules`) and hand the call to a
real group (gloo on CPUs, nccl on GPUs). Nothing in ``torch.distributed`` is replaced, so no import order can miss
a call.

Two ways to get one, each proven by ``tests/runtime/test_observed.py``:

* by name: :func:`register` adds the backend ``"observed"``; ``init_process_group(backend="observed")`` (or
  ``"observed:nccl"`` on GPUs) makes the world observed, and ``new_group`` follows it;
* in place of gloo: inside :func:`installed` (as :func:`course.runtime.launch.launch` and the grader's ranks run),
  every gloo group made (``init_process_group("gloo")``, ``init_process_group()``, ``new_group``,
  ``init_device_mesh``) is an observed one, and ``dist.get_backend()`` still says ``gloo``.

Listeners (:func:`listening`) are told each record and may wrap the work handle (a timed ``wait()``:
:mod:`course.runtime.observed_work`); a checker that must change what a call does (results landing only at
``wait()``) rewrites its arguments (:func:`rewriting`); a checker's own calls are told to neither (:func:`unheard`).
Taught in ``notebooks/04_allreduce.ipynb`` (what a collective sends) and used by the labs' logs and the grader.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed import ProcessGroup

from course.runtime import nccl_rules
from course.runtime.collective_names import METHODS, sent_bytes
from course.runtime.observed_record import Record, flatten, locate

NAME = "observed"
_GLOO = ProcessGroup.BackendType.GLOO
_NCCL = ProcessGroup.BackendType.NCCL
After = Callable[[Any], Any]  # work -> work: told the call's work handle as it returns
Listener = Callable[[Record], After | None]
#: (record, args) -> (the args the real group gets, After), or None to leave the call as it is
Rewriter = Callable[[Record, tuple], tuple[tuple, After] | None]
_LISTENERS: list[Listener] = []
_REWRITERS: list[Rewriter] = []
_LOCK = threading.Lock()
_UNHEARD = threading.local()  # .on: inside unheard(): a checker's own call, told to no listener


class ObservedGroup(ProcessGroup):
    """A process group that records every call and keeps NCCL's rules, then runs it on a real group.

    Args:
        store, rank, size, timeout: as ``torch.distributed`` gives a backend's constructor.
        real: ``"gloo"`` (CPU tensors; the rules are enforced) or ``"nccl"`` (GPU tensors; recorded only: NCCL
            enforces its rules itself).
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta, real: str = "gloo") -> None:
        super().__init__(rank, size)
        backend, kind = _real_backend(store, rank, size, timeout, real)
        self.inner = ProcessGroup(store, rank, size)  # the real group: every call is handed to it
        for group in (self.inner, self):  # both answer _get_backend, _device_types and sequence numbers
            group._set_default_backend(kind)
            for device in ("cpu", "cuda") if real == "gloo" else ("cuda",):
                group._register_backend(torch.device(device), kind, backend)
        self.options = backend.options  # init_process_group sets the group's name and ranks on it
        self.real = real
        self.rules = nccl_rules.Rules(self, store, enforce=real == "gloo")
        _INNER_TO_OUTER[id(self.inner)] = self

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self.real

    def _issue(self, method: str, args: tuple, kwargs: dict) -> Any:
        """Note the call, check it, tell the listeners, hand it to the real group; return its work handle."""
        what = METHODS[method]
        tensors = flatten(args[what.input]) if what.input is not None and len(args) > what.input else []
        record = self._record(method, what, args, tensors)
        if _KEEP_SENT and what.op == "send" and tensors:
            record.sent = tensors[0].detach().to("cpu", copy=True)
        self.rules.before(record, tensors, args)
        afters = []
        if not getattr(_UNHEARD, "on", False):
            for rewriter in tuple(_REWRITERS):
                if (rewritten := rewriter(record, args)) is not None:
                    args, after = rewritten
                    afters.append(after)
            afters += [after for listener in tuple(_LISTENERS) if (after := listener(record)) is not None]
        work = self.rules.issue(record, method, args, kwargs)
        record.end = time.perf_counter()
        for after in afters:
            work = after(work)
        return work

    def _record(self, method: str, what: Any, args: tuple, tensors: list[torch.Tensor]) -> Record:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        peer = tag = None
        if what.kind == "p2p" and method != "recv_anysource":
            peer, tag = self.global_rank(args[1]), (args[2] if len(args) > 2 else 0)
        api, caller, by_torch, where = locate(method)
        return Record(op=what.op, kind=what.kind, api=api, method=method, group=self.group_name or "",
                      group_size=self.size(), peer=peer, tag=tag, nbytes=nbytes,
                      sent_bytes=sent_bytes(what.op, nbytes, self.size()),
                      shapes=tuple(tuple(t.shape) for t in tensors),
                      dtype=str(tensors[0].dtype).removeprefix("torch.") if tensors else "",
                      where=where, caller=caller, by_torch=by_torch, thread=threading.get_ident(),
                      start=time.perf_counter(), async_op=bool(getattr(args[-1] if args else None, "asyncOp", True)))

    def global_rank(self, group_rank: int) -> int:
        """The default group's number of this group's rank ``group_rank`` (itself if the world does not know this
        group yet: while it is being made)."""
        try:
            return dist.get_global_rank(self, group_rank)
        except (RuntimeError, ValueError):
            return group_rank

    def _set_sequence_number_for_group(self) -> None:
        self.inner._set_sequence_number_for_group()

    def shutdown(self) -> None:
        """Check NCCL's agreement rule at the group's last collective, then shut the real group down.

        ``destroy_process_group`` calls this for each group it destroys (the world's and every subgroup), so a
        difference after the last sampled check fails at the script's ``destroy_process_group`` line.

        Raises:
            NcclRuleError: the ranks' collectives differ (the group stays; a second destroy shuts it down).
        """
        nccl_rules.settle([self])
        super().shutdown()


def _method(name: str) -> Callable[..., Any]:
    """The :class:`ObservedGroup` method ``name``: note, check and hand on the call."""
    def method(self: ObservedGroup, *args: Any, **kwargs: Any) -> Any:
        return self._issue(name, args, kwargs)

    method.__name__ = method.__qualname__ = name
    return method


for _name in METHODS:  # every collective and message method of ProcessGroup, from the one table
    setattr(ObservedGroup, _name, _method(_name))


#: id(the real group inside an observed one) -> the observed group, for code that meets the inner one (the
#: listeners of :mod:`course.runtime.intercept` see the messages the inner group sends).
_INNER_TO_OUTER: dict[int, ObservedGroup] = {}


def outer(group: Any) -> Any:
    """The observed group whose real group is ``group``, or ``group`` itself."""
    return _INNER_TO_OUTER.get(id(group), group)


def _real_backend(store: Any, rank: int, size: int, timeout: datetime.timedelta, real: str) -> tuple[Any, Any]:
    """The real backend (gloo's or nccl's), wrapped in torch's debug checks under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
    as ``init_process_group`` wraps a plain one."""
    if real == "nccl":
        options = c10d.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return c10d.ProcessGroupNCCL(store, rank, size, options), _NCCL
    backend = _GLOO_CLASS(store, rank, size, timeout=timeout)
    if c10d.get_debug_level() == c10d.DebugLevel.DETAIL:
        backend = c10d._create_process_group_wrapper(backend, NAME, store, rank, size, timeout)
    return backend, _GLOO


# ----------------------------------------------------------------------------------------------- listeners
_KEEP_SENT: list[bool] = []  # not empty: inside keeping_sent()


@contextmanager
def keeping_sent() -> Iterator[None]:
    """Inside the ``with`` block, each send's :class:`Record` keeps a CPU copy of the tensor it sends (``sent``):
    what the ring lab draws, message by message. It copies every message, so keep it to small tensors."""
    _KEEP_SENT.append(True)
    try:
        yield
    finally:
        _KEEP_SENT.pop()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Tell ``listener`` of every call an observed group makes inside the ``with`` block, before it runs; what it
    returns (if not None) is told the call's work handle and may return a wrapped one (a timed ``wait()``)."""
    add_listener(listener)
    try:
        yield
    finally:
        remove_listener(listener)


@contextmanager
def rewriting(rewriter: Rewriter) -> Iterator[None]:
    """Inside the ``with`` block, ``rewriter`` may change what each call of an observed group does: told the record
    and the group method's arguments, it returns the arguments the real group gets instead and an :data:`After`
    for the work handle (a checker making results land only at ``wait()``), or None."""
    with _LOCK:
        _REWRITERS.append(rewriter)
    try:
        yield
    finally:
        with _LOCK:
            _REWRITERS[:] = [other for other in _REWRITERS if other != rewriter]


def unheard(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a ``torch.distributed`` function), whose calls on this thread no listener or rewriter is told
    of: a checker's own collectives, kept out of the learner's record. NCCL's rules still apply."""
    def call(*args: Any, **kwargs: Any) -> Any:
        was = getattr(_UNHEARD, "on", False)
        _UNHEARD.on = True
        try:
            return function(*args, **kwargs)
        finally:
            _UNHEARD.on = was

    call.__name__ = call.__qualname__ = getattr(function, "__name__", "unheard")
    return call


def add_listener(listener: Listener) -> None:
    """Tell ``listener`` of every call from now on, until :func:`remove_listener` (a rank's probes: for its life)."""
    with _LOCK:
        _LISTENERS.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop telling ``listener`` (a bound method is a new object at every access: compared with ``==``)."""
    with _LOCK:
        _LISTENERS[:] = [other for other in _LISTENERS if other != listener]


# ----------------------------------------------------------------------------------------------- the two routes
def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ObservedGroup:
    return ObservedGroup(store, rank, size, timeout, "nccl" if torch.cuda.is_available() else "gloo")


def register() -> None:
    """Add the backend ``"observed"`` (once per process): ``init_process_group(backend="observed")``."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu", "cuda"])


_GLOO_CLASS = c10d.ProcessGroupGloo  # torch's own gloo backend, whatever stands in its place


class _GlooOrObserved(type):
    """What ``init_process_group`` checks a gloo backend against (``isinstance(pg, ProcessGroupGloo)``)."""

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, (_GLOO_CLASS, ObservedGroup))


class ObservedGloo(metaclass=_GlooOrObserved):
    """Stands in for ``ProcessGroupGloo`` inside ``torch.distributed`` while :func:`installed`: what
    ``init_process_group`` builds as a gloo backend is an :class:`ObservedGroup` on a real one."""

    Options = _GLOO_CLASS._Options
    create_device = staticmethod(_GLOO_CLASS.create_device)
    create_default_device = staticmethod(_GLOO_CLASS.create_default_device)

    def __new__(cls, store: Any, rank: int, size: int, timeout: datetime.timedelta = c10d.default_pg_timeout
                ) -> ObservedGroup:  # type: ignore[misc]
        return ObservedGroup(store, rank, size, timeout, "gloo")


def install() -> None:
    """From now on, every gloo group this process makes is observed (see the module doc).

    Not under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: torch then wraps each group in a checker of its own, built on a
    gloo group of its own, which this class would recurse into. DETAIL checks collectives' agreement itself.
    """
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        return
    c10d.ProcessGroupGloo = ObservedGloo


def uninstall() -> None:
    """Gloo groups made from now on are torch's own again."""
    c10d.ProcessGroupGloo = _GLOO_CLASS


@contextmanager
def installed() -> Iterator[None]:
    """Inside the ``with`` block, every gloo group made is observed (:func:`install`); torch's own after."""
    was = c10d.ProcessGroupGloo
    install()
    try:
        yield
    finally:
        c10d.ProcessGroupGloo = was


@contextmanager
def unobserved() -> Iterator[None]:
    """Inside the ``with`` block, gloo groups made are torch's own: for a group that is gloo by design on GPUs too
    (the parameter server's, whose "receive from any rank" NCCL has not), whose rules are gloo's."""
    was = c10d.ProcessGroupGloo
    uninstall()
    try:
        yield
    finally:
        c10d.ProcessGroupGloo = was


def settle() -> None:
    """Check NCCL's agreement rule once more on every live observed group of this process, at its last collective
    (:func:`course.runtime.nccl_rules.settle`): a rank of ``launch`` or of the grader calls it as its function or
    script returns. A group destroyed before was checked as it was (:meth:`ObservedGroup.shutdown`)."""
    nccl_rules.settle([group for group in _INNER_TO_OUTER.values() if group in c10d._world.pg_map])


def is_observed(group: Any = None) -> bool:
    """True when ``group`` (default: the world's) is an :class:`ObservedGroup`."""
    if group is None:
        group = c10d._get_default_group() if dist.is_initialized() else None
    return isinstance(group, ObservedGroup)
