"""Work handles that act when the code waits: when a call's result was waited for, and results that land only then.

An observed group (:mod:`course.runtime.observed`) hands every call's work handle to its listeners, which may hand
back a :class:`HeldWork` around it. It is a real ``dist.Work``: torch's own callers (``dist.all_reduce`` waiting
for a blocking call, a functional collective's ``wait_tensor``, DDP's reducer) reach its methods as the learner's
code does. So the labs time each wait (:mod:`course.runtime.recorder`) and make a collective's result land in the
learner's tensor only at ``wait()`` (:mod:`grader.labs.late_results`, :mod:`grader.labs.fsdp.gathers`), however the
call was made.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future


class _WaitedFuture(Future):
    """A work handle's future whose ``wait()`` and ``value()`` count as waiting for the call (``on_wait``)."""

    def __init__(self, on_wait: Callable[[], None]) -> None:
        super().__init__()
        self._on_wait = on_wait

    def wait(self) -> Any:
        self._on_wait()
        return super().wait()

    def value(self) -> Any:
        self._on_wait()
        return super().value()


class HeldWork(dist.Work):
    """The work handle ``inner``, handed on: ``on_wait`` runs as the code first waits for it (``wait()``, or its
    future's ``wait()``/``value()``), ``on_done`` once the call completed, before the code can see its result.

    Args:
        inner: the real call's work handle.
        on_wait: told once, when the code first waits.
        on_done: told once, after the call completed (results landing in the learner's tensors).
        swap: ``id(tensor) -> tensor``: in the future's value, a private tensor the call wrote is replaced by the
            learner's tensor it landed in.

    The handle holds the learner's tensors weakly once their result has landed: the labs keep every handle for
    the rank's life, and a tensor the learner let go must be freed (the FSDP lab measures what stays alive).
    """

    def __init__(self, inner: Any, on_wait: Callable[[], None] | None = None,
                 on_done: Callable[[], None] | None = None, swap: dict[int, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.inner = inner
        self._on_wait, self._on_done = on_wait, on_done
        self._swap = {key: weakref.ref(tensor) for key, tensor in (swap or {}).items()}
        self._waited = self._done = False
        self._future: Future | None = None

    def _waiting(self) -> None:
        if not self._waited:
            self._waited = True
            if self._on_wait is not None:
                self._on_wait()

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            if self._on_done is not None:
                self._on_done()
                self._on_done = None  # it holds the learner's tensors

    def wait(self, *args: Any) -> bool:
        self._waiting()
        result = self.inner.wait(*args)
        self._finish()
        return result

    def get_future(self) -> Future:
        """A future completed after ``on_done``, holding the learner's tensors; waiting on it counts as waiting."""
        if self._future is None:
            future = _WaitedFuture(self._waiting)

            def landed(done: Future) -> None:
                try:
                    value = done.value()
                except Exception as error:  # noqa: BLE001 - the call's own failure, handed to whoever waits
                    future.set_exception(error)
                    return
                self._finish()
                future.set_result(self._swapped(value))
            self.inner.get_future().add_done_callback(landed)
            self._future = future
        return self._future

    def _swapped(self, value: Any) -> Any:
        if isinstance(value, list):
            return [_alive(self._swap.get(id(item)), item) for item in value]
        return value

    def is_completed(self) -> bool:
        return bool(self.inner.is_completed())

    def is_success(self) -> bool:
        return bool(self.inner.is_success())

    def exception(self) -> Any:
        return self.inner.exception()

    def source_rank(self) -> int:
        return self.inner.source_rank()

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._swapped(self.inner.result())

    def synchronize(self) -> None:
        self.inner.synchronize()


def _alive(ref: weakref.ref | None, otherwise: Any) -> Any:
    """The tensor ``ref`` points at, or ``otherwise`` without one."""
    tensor = ref() if ref is not None else None
    return otherwise if tensor is None else tensor
