"""Make a race fail every time: an asynchronous collective's result lands in the student's tensor only at ``wait()``.

On a real machine the result of ``dist.all_reduce(t, async_op=True)`` lands in ``t`` at some moment before
``wait()`` returns. Code that reads ``t`` before its ``wait()`` (or never waits) is wrong, but a fast network can
make it look right by luck. ``with results_at_wait():`` removes the luck: the collective runs on a private copy,
and the copy is written into ``t`` when (and only when) the student waits for the work handle (``wait()``, or the
future's ``wait()``/``value()``). Until then ``t`` holds exactly what the student put in. Used by the DDP lab
(:mod:`grader.labs.ddp`), whose diagnosis then tells a missing ``wait()`` from a missing copy-back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from course.runtime import intercept

#: collective -> the index of the argument its result lands in
OUTPUTS = {"all_reduce": 0, "reduce_scatter_tensor": 0, "all_gather_into_tensor": 0}


class Late:
    """A work handle whose result is copied into the student's tensor when it is waited for."""

    def __init__(self, work: Any, private: torch.Tensor, target: torch.Tensor) -> None:
        self._work, self._private, self._target, self._landed = work, private, target, False

    def _land(self) -> None:
        if not self._landed:
            self._target.copy_(self._private)
            self._landed = True

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        self._land()
        return result

    def get_future(self) -> Any:
        def landed(future: Any) -> list[torch.Tensor]:
            future.wait()
            self._land()
            return [self._target]
        return self._work.get_future().then(landed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _late(original: Callable[..., Any], output: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def late(*args: Any, **kwargs: Any) -> Any:
        target = args[output] if len(args) > output else None
        if not kwargs.get("async_op") or not isinstance(target, torch.Tensor):
            return original(*args, **kwargs)  # blocking: the result is there when the call returns anyway
        private = target.detach().clone()  # all_reduce's input is its output: the copy is reduced
        return Late(original(*args[:output], private, *args[output + 1:], **kwargs), private, target)
    return late


@contextmanager
def results_at_wait() -> Iterator[None]:
    """While open, ``async_op=True`` collectives (:data:`OUTPUTS`) write their result only at ``wait()``."""
    with intercept.replacing(OUTPUTS, lambda name, current: _late(current, OUTPUTS[name])):
        yield
