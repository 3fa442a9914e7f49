"""One interceptor of ``torch.distributed``: each function wrapped once, every listener told of each call.

Who calls what, how many bytes, to which peer: the labs' communication logs (:mod:`course.runtime.comm_log`,
:mod:`course.runtime.recorder`) and the grader's probes (:mod:`grader.inrank.probes`) all need to see what a
student's code asks of ``torch.distributed``. They do not wrap torch themselves. Each registers a *listener*
here for the names it watches::

    def listener(call: Call) -> After | None:
        ...                          # runs before the call
        return lambda result: result  # runs after it; may hand back a wrapped result (a timed work handle)

    with listening(listener, ("all_reduce", "isend")):
        student_code()

A wrapper replaces the function in ``torch.distributed.distributed_c10d`` and, where it is the same function, in
``torch.distributed``; so ``from torch.distributed import send`` finds it when the student's file is loaded while
a listener listens. The originals come back when the last listener leaves. :func:`original` is torch's own
function, for a checker's reference call, never seen by listeners.

Every point-to-point message ends in a method of the process group itself, ``ProcessGroup.send`` or
``ProcessGroup.recv`` (``dist.isend`` does, and so does :class:`course.collectives.protocol.Comm`, which calls them
directly): listening to those names (:data:`MESSAGES`) sees each message, however it was sent. Waiting for one
ends in ``Work.wait`` (``dist.recv`` calls it too): listening to it sees a rank block on a message
(:mod:`course.runtime.waits`).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed import ProcessGroup

#: Methods listened to by a qualified name: ``name -> (owner, attribute)``. Their calls get the object (the group,
#: the work handle) as ``args[0]``.
METHODS = {"ProcessGroup.send": (ProcessGroup, "send"), "ProcessGroup.recv": (ProcessGroup, "recv"),
           "Work.wait": (c10d.Work, "wait")}
#: The methods that every point-to-point message ends in: ``ProcessGroup.send(tensors, group_peer, tag)``, ``recv``.
MESSAGES = ("ProcessGroup.send", "ProcessGroup.recv")


@dataclass(frozen=True)
class Call:
    """One call into a wrapped function, as a listener sees it before it runs.

    Attributes:
        name: the function's name in ``torch.distributed`` (``"all_reduce"``, ``"isend"``).
        args, kwargs: the arguments it was called with.
        caller: the file of the code that called it (torch's own code or the student's).
        nested: called from inside another wrapped call on this thread (torch's ``send`` calls ``isend``);
            a log of what the student asked for records only the outermost call.
    """

    name: str
    args: tuple
    kwargs: dict
    caller: str
    nested: bool


After = Callable[[Any], Any]  # result -> result: told the result (None if the call raised)
Listener = Callable[[Call], After | None]


class Interceptor:
    """The wrappers of ``torch.distributed`` and their listeners, by function name (see the module doc)."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[Listener]] = {}
        self._originals: dict[str, Callable[..., Any]] = {}
        self._installed: dict[str, list[tuple[Any, str, Callable[..., Any]]]] = {}  # name -> (owner, attr, wrapper)
        self._local = threading.local()
        self._lock = threading.Lock()

    def add(self, listener: Listener, names: Iterable[str]) -> None:
        """Tell ``listener`` of every call to each of ``names`` (those torch has) from now on."""
        with self._lock:
            for name in names:
                if name not in METHODS and not hasattr(c10d, name) and not hasattr(dist, name):
                    continue
                if name not in self._installed:
                    self._install(name)
                self._listeners.setdefault(name, []).append(listener)

    def remove(self, listener: Listener) -> None:
        """Stop telling ``listener``; a function no listener watches any more is torch's own again."""
        with self._lock:
            for name in list(self._listeners):
                # != and not `is`: a bound method (``self._listen``) is a new object at every access
                self._listeners[name] = [other for other in self._listeners[name] if other != listener]
                if not self._listeners[name]:
                    del self._listeners[name]
                    self._uninstall(name)

    def original(self, name: str) -> Callable[..., Any]:
        """torch's own function ``name``, wrapped or not: calls to it reach no listener."""
        if name in self._originals:
            return self._originals[name]
        if name in METHODS:
            return getattr(*METHODS[name])
        return getattr(c10d, name, None) or getattr(dist, name)

    def replaced(self) -> list[str]:
        """Qualified names of wrapped functions that something else has since replaced (a script overwriting
        ``dist.all_reduce``), e.g. ``torch.distributed.all_reduce``."""
        return [f"{owner.__module__ if isinstance(owner, type) else owner.__name__}.{_qualified(owner, attr)}"
                for places in self._installed.values() for owner, attr, wrapper in places
                if getattr(owner, attr, None) is not wrapper]

    def _install(self, name: str) -> None:
        original = self.original(name)
        self._originals[name] = original
        wrapper = self._wrapper(name, original)
        owners = [(METHODS[name][0], METHODS[name][1])] if name in METHODS else [(c10d, name), (dist, name)]
        places = []
        for owner, attr in owners:
            if getattr(owner, attr, None) is original:
                setattr(owner, attr, wrapper)
                places.append((owner, attr, wrapper))
        self._installed[name] = places

    def _uninstall(self, name: str) -> None:
        for owner, attr, wrapper in self._installed.pop(name, []):
            if getattr(owner, attr, None) is wrapper:
                setattr(owner, attr, self._originals[name])
        self._originals.pop(name, None)

    def announce(self, name: str, args: tuple) -> list[After]:
        """Tell the listeners of ``name`` of a call made another way (see :func:`announced`)."""
        call = Call(name, args, {}, sys._getframe(2).f_code.co_filename, False)
        return [after for listener in tuple(self._listeners.get(name, ())) if (after := listener(call)) is not None]

    def _wrapper(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def intercepted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            call = Call(name, args, kwargs, sys._getframe(1).f_code.co_filename, depth > 0)
            afters = [after for listener in tuple(self._listeners.get(name, ()))
                      if (after := listener(call)) is not None]
            self._local.depth = depth + 1
            result = None
            try:
                result = function(*args, **kwargs)
            finally:
                self._local.depth = depth
                for after in afters:
                    result = after(result)
            return result

        return intercepted


def _qualified(owner: Any, attr: str) -> str:
    return f"{owner.__name__}.{attr}" if isinstance(owner, type) else attr


#: The one interceptor of this process.
INTERCEPTOR = Interceptor()


def original(name: str) -> Callable[..., Any]:
    """torch's own ``torch.distributed`` function ``name`` (see :meth:`Interceptor.original`)."""
    return INTERCEPTOR.original(name)


@contextmanager
def listening(listener: Listener, names: Iterable[str]) -> Iterator[None]:
    """Tell ``listener`` of every call to ``names`` inside the ``with`` block (see the module doc)."""
    INTERCEPTOR.add(listener, names)
    try:
        yield
    finally:
        INTERCEPTOR.remove(listener)


@contextmanager
def announced(name: str, *args: Any) -> Iterator[None]:
    """The ``with`` block counts, for the listeners, as a call to ``name`` with ``args``: a wait for a work handle
    done through another object (:mod:`course.runtime.message_headers` waits for a message's header that way)."""
    afters = INTERCEPTOR.announce(name, args)
    result = None
    try:
        yield
    finally:
        for after in afters:
            result = after(result)


@contextmanager
def replacing(names: Iterable[str], wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Inside the ``with`` block, each ``torch.distributed`` function of ``names`` (those this torch has) is
    ``wrap(name, current)``, in ``torch.distributed`` and ``distributed_c10d`` alike; both come back on exit.

    For a checker that must change what a call does (not only hear of it, as a listener does); nested inside
    :func:`listening`, the wrapper wraps the interceptor's function, so listeners still hear the call.
    """
    saved = []
    for name in names:
        if not hasattr(dist, name):
            continue
        current = getattr(dist, name)
        saved.append((name, current, getattr(c10d, name)))
        wrapper = wrap(name, current)
        setattr(dist, name, wrapper)
        setattr(c10d, name, wrapper)
    try:
        yield
    finally:
        for name, in_dist, in_c10d in saved:
            setattr(dist, name, in_dist)
            setattr(c10d, name, in_c10d)
