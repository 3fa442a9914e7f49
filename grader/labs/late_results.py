"""Make a race fail every time: an asynchronous collective's result lands in the student's tensor only at ``wait()``.

On a real machine the result of ``dist.all_reduce(t, async_op=True)`` lands in ``t`` at some moment before
``wait()`` returns. Code that reads ``t`` before its ``wait()`` (or never waits) is wrong, but a fast network can
make it look right by luck. ``with results_at_wait():`` removes the luck: the collective runs on a private copy,
and the copy is written into ``t`` when (and only when) the student waits for the work handle (``wait()``, or the
future's ``wait()``/``value()``). Until then ``t`` holds exactly what the student put in. It acts on the process
group (:func:`course.runtime.observed.rewriting`), so every route to an all-reduce, all-gather or reduce-scatter is
held alike: ``all_reduce`` imported by name, ``all_gather_single`` or ``all_gather_into_tensor``, the list form of
``all_gather``, a functional collective. On a group of torch's own (nccl on GPUs) it wraps the functions of
``torch.distributed`` by name instead. Used by the DDP lab (:mod:`grader.labs.ddp`), whose diagnosis then tells a
missing ``wait()`` from a missing copy-back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from course.runtime import collective_names, intercept, observed
from course.runtime.observed_record import Record, flatten
from course.runtime.observed_work import HeldWork

#: the operations whose result lands in their first argument, held until ``wait()``
HELD = ("all_reduce", "all_gather", "reduce_scatter")
#: on a group of torch's own: function -> the index of the argument its result lands in
OUTPUTS = {name: 0 for name in collective_names.functions(*HELD) if collective_names.FUNCTIONS[name].input is not None}


def private_like(output: Any, make: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``output`` (a tensor, or lists of them) with each tensor replaced by ``make(tensor)``."""
    if isinstance(output, torch.Tensor):
        return make(output)
    return [private_like(item, make) for item in output]


def land(targets: Any, private: Any) -> None:
    """Copy each private tensor into the student's tensor it stands for."""
    for mine, theirs in zip(flatten(targets), flatten(private), strict=True):
        mine.copy_(theirs)


def held(work: Any, targets: Any, private: Any, on_wait: Callable[[], None] | None = None) -> HeldWork:
    """``work``, whose result (in ``private``) lands in ``targets`` when it is first waited for, and not before."""
    swap = {id(theirs): mine for mine, theirs in zip(flatten(targets), flatten(private), strict=True)}
    return HeldWork(work, on_wait=on_wait, on_done=lambda: land(targets, private), swap=swap)


def _rewrite(record: Record, args: tuple) -> tuple[tuple, Any] | None:
    """On the process group: an asynchronous held collective runs into a private copy of its output."""
    if not record.async_op or record.op not in HELD or not args or not flatten(args[0]):
        return None  # blocking: the result is there when the call returns anyway
    targets = args[0]
    private = private_like(targets, lambda t: t.detach().clone())  # all_reduce's input is its output: the copy
    return (private, *args[1:]), lambda work: held(work, targets, private)


def _late(original: Callable[..., Any], output: int) -> Callable[..., Any]:
    """On a group of torch's own: the function ``original``, its result landing at ``wait()``."""
    @functools.wraps(original)
    def late(*args: Any, **kwargs: Any) -> Any:
        target = args[output] if len(args) > output else None
        if not kwargs.get("async_op") or not isinstance(target, torch.Tensor):
            return original(*args, **kwargs)
        private = target.detach().clone()
        return held(original(*args[:output], private, *args[output + 1:], **kwargs), target, private)
    return late


@contextmanager
def results_at_wait() -> Iterator[None]:
    """While open, asynchronous all-reduces, all-gathers and reduce-scatters write their result only at ``wait()``."""
    if observed.is_observed():
        with observed.rewriting(_rewrite):
            yield
    else:
        with intercept.replacing(OUTPUTS, lambda name, current: _late(current, OUTPUTS[name])):
            yield
