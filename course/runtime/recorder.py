"""What a student's code asked of ``torch.distributed``, recorded inside the rank by trusted code.

:class:`Recorder` listens to the collectives of ``torch.distributed`` through :mod:`course.runtime.intercept`
(whose wrappers ``from torch.distributed import all_reduce`` finds if the student's file is loaded while it
listens) and notes every call: its name, when it was launched, when it
returned, when the student waited for it (an ``async_op=True`` call returns a work handle whose ``wait()`` is
timed), its tensor bytes and the bytes a bandwidth-optimal (ring) algorithm sends from each rank for it. It also
notes every construction of a forbidden class (torch's ``DistributedDataParallel`` in the DDP lab). The labs'
checks (``grader.labs.ddp``, ``grader.labs.zero``) read the record; the checker's own collectives use the
originals, kept in :data:`ORIGINAL`, and are never recorded.

Beside :class:`course.runtime.comm_log.CommLog` (the ring lab's: which calls, and the bytes of point-to-point sends),
this one adds what DDP and ZeRO need: the ``wait()`` time of each async call (overlap), each collective's
bytes sent as a ring algorithm sends them (communication volume), one record for a deprecated alias that calls
its new name (``reduce_scatter_tensor`` -> ``reduce_scatter_single``), and forbidden constructions.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from course.runtime import collective_names, intercept


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _sent(name: str, args: tuple, world_size: int) -> float:
    """Bytes one rank sends for the call ``name(*args)`` in a bandwidth-optimal (ring) algorithm: the one table's
    rule (:data:`course.runtime.collective_names.SENT`) on the bytes of its input argument."""
    what = collective_names.FUNCTIONS[name]
    given = _nbytes(args[what.input]) if what.input is not None and len(args) > what.input else 0
    return collective_names.sent_bytes(what.op, given, world_size)


_SENT = collective_names.FUNCTIONS  # the names recorded: every collective and message function, old and new

#: The functions of torch.distributed as they were before any Recorder was installed.
ORIGINAL: dict[str, Callable[..., Any]] = {name: intercept.original(name) for name in _SENT if hasattr(dist, name)}


@dataclass
class Call:
    """One collective the student's code called. Times are ``time.perf_counter()`` seconds."""

    name: str
    launched: float
    returned: float = float("nan")
    waited: float | None = None  # when the student waited for it (a blocking call: when it returned)
    nbytes: int = 0
    sent_bytes: float = 0.0
    async_op: bool = False


class _Future:
    """A future of a recorded call: ``wait()``/``value()`` count as waiting for the call."""

    def __init__(self, future: Any, call: Call) -> None:
        self._future, self._call = future, call

    def wait(self) -> Any:
        _mark_waited(self._call)
        return self._future.wait()

    def value(self) -> Any:
        _mark_waited(self._call)
        return self._future.value()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


class _Work:
    """The work handle of a recorded ``async_op=True`` call: its ``wait()`` is timed."""

    def __init__(self, work: Any, call: Call) -> None:
        self._work, self._call = work, call

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        _mark_waited(self._call)
        return self._work.wait(*args, **kwargs)

    def get_future(self) -> _Future:
        return _Future(self._work.get_future(), self._call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


#: Every work handle the student's calls returned, kept for the life of the rank: a collective started during
#: backward holds autograd's Python context, and if gloo's worker thread dropped the last reference to it while
#: the main thread, holding the GIL, destroys the group, both would wait for ever (see course.ddp.hooks).
_KEPT: list[Any] = []


def _mark_waited(call: Call) -> None:
    if call.waited is None:
        call.waited = time.perf_counter()


@dataclass
class Recorder:
    """The record of one rank's calls; install it with :func:`recording`."""

    world_size: int
    calls: list[Call] = field(default_factory=list)
    constructed: list[str] = field(default_factory=list)  # forbidden classes the student built

    def clear(self) -> None:
        self.calls.clear()

    def named(self, *names: str) -> list[Call]:
        return [call for call in self.calls if call.name in names]

    def sent_bytes(self) -> float:
        return sum(call.sent_bytes for call in self.calls)

    def listen(self, call: intercept.Call) -> intercept.After | None:
        """The listener of :func:`recording`: note ``call`` (the outermost only: a deprecated alias calling its new
        name counts once) and time it; an async call's work handle comes back with a timed ``wait()``."""
        if call.nested or call.name not in _SENT:
            return None
        noted = Call(call.name, time.perf_counter(), nbytes=_nbytes(call.args[:2]))
        noted.sent_bytes = _sent(call.name, call.args, self.world_size)
        self.calls.append(noted)

        def returned(result: Any) -> Any:
            noted.returned = time.perf_counter()
            noted.async_op = hasattr(result, "wait")  # a work handle: async_op=True, however it was passed
            if not noted.async_op:
                noted.waited = noted.returned
                return result
            _KEPT.append(result)
            return _Work(result, noted)
        return returned


@contextmanager
def recording(world_size: int, forbidden: tuple[type, ...] = ()) -> Iterator[Recorder]:
    """Record every ``torch.distributed`` collective and every construction of a ``forbidden`` class meanwhile.

    Load the student's file inside the ``with`` block so names it imports from torch.distributed are the
    recording ones. Everything is put back on exit.
    """
    recorder = Recorder(world_size)
    saved: list[tuple[Any, str, Any]] = []
    for cls in forbidden:
        saved.append((cls, "__init__", cls.__init__))
        cls.__init__ = _noting(cls.__init__, cls.__name__, recorder)
    try:
        with intercept.listening(recorder.listen, ORIGINAL):
            yield recorder
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _noting(init: Callable[..., None], class_name: str, recorder: Recorder) -> Callable[..., None]:
    @functools.wraps(init)
    def noted(self: Any, *args: Any, **kwargs: Any) -> None:
        recorder.constructed.append(class_name)
        init(self, *args, **kwargs)
    return noted
