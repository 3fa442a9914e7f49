"""Where did the distributed run go wrong? The first recorded tensor that differs from the one-process run.

A wrong result at the end of a step says little: every tensor after the bug is wrong too. Differential testing
records the same named tensors in both runs (each module's output in forward, each parameter's gradient in
backward, step by step, rank by rank) and walks them in the order they were computed. The first one beyond
its rounding bound (:mod:`course.numerics.bounds`) is where the bug is, or just after it:

    the first tensor that diverges is fc2's output (forward, step 0, rank 0): beyond rounding: a bug
    (bound 2.4e-06, seen 0.334)

:class:`Recorder` fills the records with forward hooks on ``named_modules()`` and gradient hooks on
``named_parameters()``; a check may also add its own (:meth:`Recorder.add`). Used by the labs that compare with
a one-process reference (:mod:`grader.labs`: tp_mlp, sequence_parallel, ddp; zero and fsdp name the first
parameter beyond rounding after a step, :data:`PARAMETERS`) and by notebook 08.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from course.numerics.bounds import Verdict, verdict

FORWARD, GRADIENT, PARAMETERS = "forward", "backward", "parameters"  # PARAMETERS: after an optimizer step


@dataclass(frozen=True)
class Record:
    """One named tensor of one run: what it is, in which phase, step and rank (and chunk, for chunked algorithms)."""

    name: str  # a module or parameter name from named_modules()/named_parameters(), or the check's own words
    phase: str  # FORWARD (an activation), GRADIENT, or PARAMETERS (a parameter after an optimizer step)
    step: int
    rank: int
    tensor: torch.Tensor
    chunk: int | None = None

    @property
    def key(self) -> tuple:
        return self.name, self.phase, self.step, self.rank, self.chunk

    def where(self) -> str:
        """``"fc2's output (forward, step 0, rank 0)"``: the record in the learner's terms."""
        what = {FORWARD: f"{self.name}'s output", PARAMETERS: f"{self.name} after the optimizer step"}.get(
            self.phase, f"{self.name}'s gradient")
        chunk = "" if self.chunk is None else f", chunk {self.chunk}"
        return f"{what} ({self.phase}, step {self.step}, rank {self.rank}{chunk})"


@dataclass(frozen=True)
class Divergence:
    """The first record beyond rounding, and by how much (``verdict``; None for a shape that differs)."""

    record: Record
    verdict: Verdict | None
    detail: str = ""
    position: int = 0  # the record's index in its run's records: which came first

    def __str__(self) -> str:
        judged = str(self.verdict) if self.verdict is not None else self.detail
        return f"the first tensor that diverges is {self.record.where()}: {judged}"


#: bound_fn(student's record, reference tensor) -> the largest difference rounding allows (number or tensor)
BoundFn = Callable[[Record, torch.Tensor], "torch.Tensor | float"]


def first_divergence(student: Sequence[Record], reference: Iterable[Record], bound_fn: BoundFn
                     ) -> Divergence | None:
    """Walk ``student``'s records in the order they were made; return the first beyond its bound, or None.

    A record the reference lacks is skipped (the reference names what it can compare). A shape that differs
    is a divergence of its own, named with both shapes.
    """
    expected = {record.key: record.tensor for record in reference}
    for position, record in enumerate(student):
        want = expected.get(record.key)
        if want is None:
            continue
        if record.tensor is None or record.tensor.shape != want.shape:
            got = "nothing" if record.tensor is None else f"shape {tuple(record.tensor.shape)}"
            return Divergence(record, None, f"it has {got}, expected shape {tuple(want.shape)}", position)
        judged = verdict(record.tensor, want, bound_fn(record, want))
        if not judged.within:
            return Divergence(record, judged, position=position)
    return None


@dataclass
class Recorder:
    """Records a module's named outputs (forward hooks) and its parameters' gradients, per step, on one rank.

    Set ``step`` before each step; call :meth:`gradients` once a step's gradients are final (after the
    synchronization a data-parallel step does), or let the hooks record them as backward makes them.
    """

    rank: int
    step: int = 0
    records: list[Record] = field(default_factory=list)
    _handles: list = field(default_factory=list)

    def add(self, name: str, phase: str, tensor: torch.Tensor | None, chunk: int | None = None) -> None:
        """Record ``tensor`` (copied to the CPU) under ``name`` for the current step."""
        copy = None if tensor is None else tensor.detach().cpu().clone()
        self.records.append(Record(name, phase, self.step, self.rank, copy, chunk))

    def watch_outputs(self, module: nn.Module, leaves_only: bool = True) -> Recorder:
        """Record every (leaf) submodule's output in forward, under its name in ``named_modules()``."""
        for name, sub in module.named_modules():
            if name and (not leaves_only or not list(sub.children())):
                self._handles.append(sub.register_forward_hook(
                    lambda _m, _i, out, name=name: self.add(name, FORWARD, out) if torch.is_tensor(out) else None))
        return self

    def watch_gradients(self, module: nn.Module) -> Recorder:
        """Record every parameter's gradient as backward accumulates it, under its name in named_parameters()."""
        for name, p in module.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda p, name=name: self.add(name, GRADIENT, p.grad)))
        return self

    def gradients(self, module: nn.Module, order: Sequence[str] | None = None) -> None:
        """Record the parameters' ``.grad`` as they are now (in ``order``, else reverse ``named_parameters()``:
        the order backward makes them)."""
        params = dict(module.named_parameters())
        for name in order or list(params)[::-1]:
            self.add(name, GRADIENT, params[name].grad)

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
