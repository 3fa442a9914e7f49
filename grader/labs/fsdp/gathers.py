"""What the FSDP lab watches of the student's all-gathers (:mod:`grader.labs.fsdp.check`, notebook 07).

:class:`GatherWatch` holds every tensor a gather wrote into, weakly, so the bytes of gathered parameters still
alive are measured at each gather; it notes when each gather was launched and when its data was first waited
for. It acts on the process group (:func:`course.runtime.observed.rewriting`), so every all-gather is watched
alike, however it was called: into one tensor (``all_gather_single``, ``all_gather_into_tensor``), the list form
of ``dist.all_gather``, a functional collective, a DeviceMesh's group. On a group of torch's own (nccl on GPUs)
the functions of ``torch.distributed`` are wrapped by name instead. :class:`MatmulClock` notes when each matrix
multiply ran.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course.runtime import collective_names, intercept, observed
from course.runtime.observed_record import Record, flatten
from grader.labs.late_results import held, land, private_like

#: on a group of torch's own: every all-gather's name, old and new, that gathers tensors
GATHERS = tuple(name for name in collective_names.functions("all_gather")
                if collective_names.FUNCTIONS[name].input is not None)


@dataclass
class Gather:
    """One all-gather the student issued: when, and when its data was first waited for (inf: never)."""

    launched: float
    waited: float
    async_op: bool


class GatherWatch:
    """Every tensor an all-gather wrote into, weakly held: the bytes still alive at each gather, and their peak;
    and each gather's :class:`Gather` times.

    Gathers into a tensor or into a list of tensors (``dist.all_gather``), the output as first positional
    argument, are watched. An asynchronous one (``async_op=True``, a prefetch) is noted in ``prefetched``; its
    result lands at its first wait."""

    def __init__(self) -> None:
        self.outputs: list[weakref.ref] = []
        self.gathers: list[Gather] = []
        self.peak = 0
        self.prefetched = False  # some gather was asynchronous: two layers may be alive at once
        self._inside = threading.local()  # a deprecated name calling its new one: watch the outer call only

    def alive(self) -> int:
        storages = {}
        for ref in self.outputs:
            tensor = ref()
            if tensor is not None:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()  # resize_(0) frees it in place
        return sum(storages.values())

    def _note(self, output: Any, async_op: bool) -> Gather:
        """A gather into ``output`` (a tensor or lists of them) begins: its tensors are watched from now on."""
        self.outputs += [weakref.ref(t) for t in flatten(output)]
        self.peak = max(self.peak, self.alive())
        self.prefetched |= async_op
        gather = Gather(time.perf_counter(), float("inf"), async_op)
        self.gathers.append(gather)
        return gather

    def rewrite(self, record: Record, args: tuple) -> tuple[tuple, Any] | None:
        """On the process group: a gather runs into the checker's own buffers, copied into the student's output
        at its first wait (gloo may hold its output a while after returning, and what it holds must not count as
        the student's)."""
        if record.op != "all_gather" or not args or not flatten(args[0]):
            return None
        output = args[0]
        gather = self._note(output, record.async_op)
        private = private_like(output, torch.empty_like)
        return (private, *args[1:]), lambda work: held(work, output, private, lambda: _waited(gather))

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """On a group of torch's own: the gather function ``original``, watched (the output its first argument)."""
        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            output = args[0] if args else None
            if not isinstance(output, (torch.Tensor, list, tuple)) or not flatten(output) \
                    or getattr(self._inside, "on", False):
                return original(*args, **kwargs)
            gather = self._note(output, bool(kwargs.get("async_op")))
            private = private_like(output, torch.empty_like)
            self._inside.on = True
            try:
                result = original(private, *args[1:], **kwargs)
            finally:
                self._inside.on = False
            if kwargs.get("async_op"):
                return held(result, output, private, lambda: _waited(gather))  # copied in at the first wait
            land(output, private)
            gather.waited = time.perf_counter()
            return result
        return watched


def _waited(gather: Gather) -> None:
    gather.waited = min(gather.waited, time.perf_counter())


class MatmulClock(TorchDispatchMode):
    """When each matrix multiply ran on this rank (``time.perf_counter()``), the student's layers among them."""

    KERNELS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv"})

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.overloadpacket.__name__ in self.KERNELS:
            self.times.append(time.perf_counter())
        return func(*args, **(kwargs or {}))


@contextmanager
def watching_gathers() -> Iterator[GatherWatch]:
    """While open, every all-gather's output tensor is watched (:class:`GatherWatch`)."""
    watch = GatherWatch()
    if observed.is_observed():
        with observed.rewriting(watch.rewrite):
            yield watch
    else:
        with intercept.replacing(GATHERS, lambda _name, current: watch.wrap(current)):
            yield watch
