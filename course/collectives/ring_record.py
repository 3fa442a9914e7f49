"""Your ring, message by message: what each send carried, judged step by step, drawn with the first wrong chunk.

The observation layer (:func:`course.runtime.observed.keeping_sent`) keeps a copy of every message a rank sends.
:func:`judge` reads them as a ring's steps: the k-th send of each rank is step k. At reduce-scatter step t, a
right message holds one chunk summed over t+1 neighbouring ranks' inputs: the sender's and those before it,
in the direction the ring runs. At an all-gather step it holds one chunk fully reduced (the sum, or the
average). The first message that holds no such chunk is where the ring went wrong: its step, its sender and the
chunk the ring sends there. The tolerance is derived: exact inputs summed in the message's dtype
(:mod:`course.numerics.bounds`). :func:`plot` draws every step (columns) of every rank (rows), right in green,
wrong in red, the first wrong one outlined. :func:`record_on_rank` runs a lab file's ``ring_allreduce`` on a
launched rank and keeps its sends; :func:`draw_yours` launches it and draws. Used by the ring lab's check
(:mod:`grader.labs.ring`) and ``notebooks/04_allreduce.ipynb``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from course.collectives.allreduce import chunk_bounds
from course.numerics import bounds

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Sent:
    """One message as it was sent: by ``rank``, its ``number``-th send (0-based), to ``peer``."""

    rank: int
    number: int
    peer: int | None
    payload: torch.Tensor


@dataclass(frozen=True)
class Judged:
    """A message read as a ring step: which chunk it carries (None: no chunk of its size) and whether it is right."""

    step: int  # 1-based, as the lab's messages say it
    rank: int
    peer: int | None
    chunk: int | None
    right: bool
    phase: str  # "reduce-scatter" or "all-gather"

    def where(self) -> str:
        """``"step 2 (reduce-scatter): rank 1 sent chunk 0 to rank 2"``."""
        what = f"chunk {self.chunk}" if self.chunk is not None else "a message the size of no chunk"
        to = f" to rank {self.peer}" if self.peer is not None else ""
        return f"step {self.step} ({self.phase}): rank {self.rank} sent {what}{to}"


def _tolerance(want: torch.Tensor, magnitude: torch.Tensor, terms: int, dtype: torch.dtype, divided: bool
               ) -> torch.Tensor:
    """Rounding allowed for ``terms`` exact inputs (``magnitude``: the sum of their sizes) summed in ``dtype``,
    divided once when ``divided``; the result is rounded to ``dtype`` either way."""
    allowed = bounds.summation_bound(magnitude / (terms if divided else 1), terms, dtype)
    return allowed + bounds.cast_bound(want.abs() + allowed, dtype) * (2 if divided else 1)


Candidate = tuple[torch.Tensor, torch.Tensor, int, bool]  # value, sum of |terms|, terms, divided


def _holds(payload: torch.Tensor, candidates: dict[int, Candidate]) -> int | None:
    """The chunk whose candidate value ``payload`` holds, within rounding (None: none)."""
    got = payload.double()
    for chunk, (want, magnitude, terms, divided) in candidates.items():
        if want.shape == got.shape and bool(
                ((got - want).abs() <= _tolerance(want, magnitude, terms, payload.dtype, divided)).all()):
            return chunk
    return None


def _candidates(inputs: torch.Tensor, sender: int, step: int, way: int, op: str) -> list[dict[int, Candidate]]:
    """Per chunk, what a right message of ``sender`` at 0-based ``step`` holds: one dict per accepted form."""
    n, numel = inputs.shape
    spans = chunk_bounds(numel, n)
    if step < n - 1:  # reduce-scatter: the sender's input and those of the step ranks before it
        ranks = [(sender - way * j) % n for j in range(step + 1)]
        partial, size = inputs[ranks].sum(0), inputs[ranks].abs().sum(0)
        return [{c: (partial[a:b], size[a:b], step + 1, False) for c, (a, b) in enumerate(spans)}]
    total, size = inputs.sum(0), inputs.abs().sum(0)
    forms = [{c: (total[a:b], size[a:b], n, False) for c, (a, b) in enumerate(spans)}]
    if op == "avg":  # dividing before the all-gather is right too
        forms.append({c: (total[a:b] / n, size[a:b], n, True) for c, (a, b) in enumerate(spans)})
    return forms


def judge(sends: Sequence[Sent], inputs: torch.Tensor, op: str = "sum") -> list[Judged]:
    """Each message of ``sends`` read as a ring step, in step order then rank order.

    Args:
        inputs: ``(world_size, numel)`` every rank's input, exact in float64.
        op: ``"sum"`` or ``"avg"``.
    """
    n, numel = inputs.shape
    first = min(sends, key=lambda s: (s.rank, s.number), default=None)
    way = -1 if first is not None and first.peer == (first.rank - 1) % n and n > 2 else 1  # which way round
    spans = chunk_bounds(numel, n)
    judged = []
    for sent in sorted(sends, key=lambda s: (s.number, s.rank)):
        phase = "reduce-scatter" if sent.number < n - 1 else "all-gather"
        found = None
        for form in _candidates(inputs, sent.rank, sent.number, way, op):
            found = _holds(sent.payload, form)
            if found is not None:
                break
        planned = (sent.rank - way * sent.number) % n  # the chunk the course's ring sends at this step
        size = sent.payload.numel()
        if found is None and spans[planned][1] - spans[planned][0] != size:
            planned = next((c for c, (a, b) in enumerate(spans) if b - a == size), None)
        right = found is not None and sent.number < 2 * (n - 1)
        judged.append(Judged(sent.number + 1, sent.rank, sent.peer, found if right else planned, right, phase))
    return judged


def first_wrong(judged: Sequence[Judged]) -> Judged | None:
    """The first wrong message: the earliest step, then the lowest rank (None: every message is right)."""
    return next((j for j in judged if not j.right), None)


def plot(judged: Sequence[Judged], world_size: int, title: str = "", ax: Axes | None = None) -> Figure:
    """Every message of ``judged``: a column per step, a row per rank, ``c2 → 1`` for "chunk 2 to rank 1", green
    when right, red when wrong; the first wrong one outlined in black and named in the title."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    steps = max([j.step for j in judged] + [2 * (world_size - 1)])
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.75 * steps, 0.9 + 0.4 * world_size))
    for j in judged:
        colour = "#b7e4b7" if j.right else "#f4a6a6"
        ax.add_patch(Rectangle((j.step - 1.45, j.rank - 0.4), 0.9, 0.8, facecolor=colour, edgecolor="none"))
        chunk = "?" if j.chunk is None else f"c{j.chunk}"
        ax.text(j.step - 1, j.rank, f"{chunk} → {'?' if j.peer is None else j.peer}", ha="center", va="center",
                fontsize=7)
    wrong = first_wrong(judged)
    if wrong is not None:
        ax.add_patch(Rectangle((wrong.step - 1.45, wrong.rank - 0.4), 0.9, 0.8, fill=False, edgecolor="black", lw=2))
    ax.set_xlim(-0.5, steps - 0.5)
    ax.set_ylim(world_size - 0.5, -0.5)
    ax.set_xticks(range(steps), [f"{t + 1}\n{'RS' if t < world_size - 1 else 'AG'}" for t in range(steps)],
                  fontsize=7)
    ax.set_yticks(range(world_size), [f"rank {r}" for r in range(world_size)], fontsize=7)
    ax.set_xlabel("step (RS: reduce-scatter, AG: all-gather)", fontsize=7)
    said = "every message right" if wrong is None else f"first wrong: {wrong.where()}"
    ax.set_title(f"{title}\n{said}" if title else said, fontsize=8)
    ax.figure.tight_layout()
    return ax.figure


def record_on_rank(path: str, inputs: torch.Tensor, op: str = "sum") -> tuple[bool, list[Sent]]:
    """Run inside a launched rank: the ``ring_allreduce`` of the lab file at ``path`` on this rank's row of
    ``inputs`` (``(world_size, numel)``), keeping every message it sends.

    Returns:
        ``(yours, sends)``: ``yours`` is False when the file's function is not written yet (it raises
        NotImplementedError); the sends are then those of the lab's solution's ring, so that a ring is drawn.
    """
    from course.runtime import observed

    spec = importlib.util.spec_from_file_location("your_ring", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    rank, records, yours = dist.get_rank(), [], True
    tensor = inputs[rank].to(torch.float32).clone()
    with observed.keeping_sent(), observed.listening(lambda r: records.append(r) if r.op == "send" else None):
        try:
            module.ring_allreduce(tensor, op=op)
        except NotImplementedError:
            records.clear()
            yours = False
            _solution_ring(tensor.copy_(inputs[rank]), op)
    return yours, [Sent(rank, k, r.peer, r.sent) for k, r in enumerate(records)]


def draw_yours(path: str, world_size: int = 4, numel: int = 10, op: str = "sum") -> Figure | None:
    """Run the lab file's ring on ``world_size`` ranks on small integer inputs and draw its messages (notebook 04).
    A ring that fails or hangs is not drawn: what went wrong is printed instead."""
    from pathlib import Path

    from course.runtime.launch import RankFailed, RankTimeout, launch

    inputs = torch.randint(-8, 9, (world_size, numel), generator=torch.Generator().manual_seed(0)).double()
    try:
        ranks = launch(record_on_rank, world_size, str(Path(path).resolve()), inputs, op, timeout_s=60)
    except (RankFailed, RankTimeout) as error:
        print(f"your ring_allreduce did not finish on {world_size} ranks, so there is nothing to draw:\n{error}")
        return None
    whose = Path(path).name if ranks[0][0] else "the lab's solution (yours is not written yet)"
    sends = [sent for _, kept in ranks for sent in kept]
    if not sends:
        print(f"{whose} sent no message that the ranks' process group recorded, so there is nothing to draw.")
        return None
    judged = judge(sends, inputs, op)
    return plot(judged, world_size, title=f"{whose}, {numel} elements on {world_size} ranks")


def _solution_ring(tensor: torch.Tensor, op: str) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor, n)
    for step in range(2 * (n - 1)):
        send, into = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        arrived = torch.empty_like(into)
        request = dist.isend(send, (rank + 1) % n)
        dist.recv(arrived, (rank - 1) % n)
        request.wait()
        if step < n - 1:
            into.add_(arrived)
        else:
            into.copy_(arrived)
    if op == "avg":
        tensor /= n
