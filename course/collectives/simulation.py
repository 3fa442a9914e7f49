"""Watch an allreduce happen: the naive, ring and tree algorithms replayed step by step in one process.

Each algorithm is written as a *schedule* (:mod:`course.collectives.schedules`): a list of steps, each a set of
messages that travel at the same time. :func:`simulate` plays a schedule on a list of per-rank vectors and
records, after every step, each rank's vector and which ranks' inputs each of its chunks already contains;
:func:`draw` turns that into one diagram per step. The schedules follow ``course.collectives.allreduce`` exactly (the
real ring additionally cuts chunks into pieces to pipeline them; the steps are the same). Taught in
``notebooks/04_allreduce.ipynb``.

    sim = simulate("ring", example_inputs(world_size=4, numel=8))
    sim.steps            # 6 == 2 * (4 - 1)
    draw(sim)            # 7 panels: the start, then each step
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from course import exercise
from course.collectives.allreduce import ALGORITHMS, chunk_bounds
from course.collectives.schedules import WHOLE, Message, Step

if TYPE_CHECKING:  # matplotlib is imported only when drawing
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Snapshot:
    """State after a step. ``values[r]``: rank r's vector, shape (numel,). ``holds[r, c, s]``: True if
    rank r's chunk c contains rank s's input, shape (world_size, world_size, world_size)."""

    step: Step | None
    values: np.ndarray
    holds: np.ndarray


@dataclass(frozen=True)
class Simulation:
    """A whole run: the algorithm's name and one :class:`Snapshot` per step, the initial state first."""

    algorithm: str
    snapshots: tuple[Snapshot, ...]
    elements_sent: np.ndarray  # (world_size,): elements each rank sent over the whole run

    @property
    def steps(self) -> int:
        return len(self.snapshots) - 1

    @property
    def world_size(self) -> int:
        return self.snapshots[0].values.shape[0]

    @property
    def final(self) -> np.ndarray:
        """Every rank's vector at the end, shape (world_size, numel)."""
        return self.snapshots[-1].values


def example_inputs(world_size: int, numel: int, seed: int = 0) -> list[np.ndarray]:
    """Small integer vectors, one per rank (integers so the sums are exact and easy to read)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 10, numel).astype(np.float64) for _ in range(world_size)]


def simulate(algorithm: str, inputs: Sequence[np.ndarray]) -> Simulation:
    """Play ``algorithm``'s schedule on ``inputs`` (one vector per rank, all the same length).

    Every message of a step reads its sender's state from *before* the step, as on real hardware where
    they travel at the same time.

    Raises:
        ValueError: unknown algorithm, no inputs, or vectors of different lengths.
    """
    schedules = {name: row.schedule for name, row in ALGORITHMS.items() if row.schedule is not None}
    if algorithm not in schedules:
        raise ValueError(f"algorithm must be one of {sorted(schedules)}, got {algorithm!r}.")
    return _play(algorithm, schedules[algorithm], inputs)


def _play(algorithm: str, schedule: Callable[[int], list[Step]], inputs: Sequence[np.ndarray]) -> Simulation:
    vectors = [np.asarray(v, dtype=np.float64).ravel() for v in inputs]
    lengths = sorted({v.size for v in vectors})
    if len(lengths) != 1:
        raise ValueError(f"inputs must be one vector per rank, all the same length; got lengths {lengths}.")
    values = np.stack(vectors)
    n, numel = values.shape
    bounds = chunk_bounds(numel, n)
    holds = np.zeros((n, n, n), dtype=bool)
    for r in range(n):
        holds[r, :, r] = True
    sent = np.zeros(n, dtype=np.int64)
    snapshots = [Snapshot(None, values.copy(), holds.copy())]
    for step in schedule(n):
        before_values, before_holds = values.copy(), holds.copy()
        for m in step.messages:
            chunks = range(n) if m.chunk == WHOLE else [m.chunk]
            for c in chunks:
                a, b = bounds[c]
                if step.add:
                    values[m.dest, a:b] += before_values[m.source, a:b]
                    holds[m.dest, c] |= before_holds[m.source, c]
                else:
                    values[m.dest, a:b] = before_values[m.source, a:b]
                    holds[m.dest, c] = before_holds[m.source, c]
                sent[m.source] += b - a
        snapshots.append(Snapshot(step, values.copy(), holds.copy()))
    return Simulation(algorithm, tuple(snapshots), sent)


@exercise.checker
def check_ring_send_chunk(send_chunk: Callable[[int, int, int], int], max_world_size: int = 8) -> bool:
    """Exercise checker: does ``send_chunk(rank, step, world_size)`` make a correct ring allreduce?

    Builds the ring from the student's function (rank r sends that chunk to rank r+1 at each of the
    2(n-1) steps, adding for the first n-1), simulates it on 2..``max_world_size`` ranks and prints
    feedback: which world size fails first, and what the ranks hold at the end. Used in notebook 04.

    Returns:
        True if every world size ends with the sum on every rank.
    """
    for n in range(2, max_world_size + 1):
        def schedule(world_size: int) -> list[Step]:
            return [Step("reduce-scatter" if t < world_size - 1 else "all-gather",
                         tuple(Message(r, (r + 1) % world_size, int(send_chunk(r, t, world_size)) % world_size)
                               for r in range(world_size)), add=t < world_size - 1)
                    for t in range(2 * (world_size - 1))]

        sim = _play("your ring", schedule, example_inputs(n, 2 * n))
        if not sim.snapshots[-1].holds.all():
            rank, chunk = np.argwhere(~sim.snapshots[-1].holds.all(axis=2))[0]
            print(f"Not yet: on {n} ranks, rank {rank} ends with chunk {chunk} holding only the inputs of ranks "
                  f"{_label(sim.snapshots[-1].holds[rank, chunk])}. Hint: at step 0 rank r sends its own chunk r, "
                  f"and what it sends at step t+1 is what it received at step t.")
            return False
    print(f"Correct: your ring leaves the full sum on every rank, for 2 to {max_world_size} ranks.")
    return True


def _label(held: np.ndarray) -> str:
    """The ranks a chunk holds, runs of three or more compressed: 0+1+2+4 -> '0-2+4'."""
    ranks = [int(r) for r in np.flatnonzero(held)]
    if len(ranks) == len(held):
        return "all"
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return "+".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else "+".join(map(str, run)) for run in runs)


def draw(simulation: Simulation, columns: int = 4) -> Figure:
    """One panel per step: a (rank x chunk) grid, each cell labelled with the ranks whose inputs it holds
    and shaded by how many; cells that just received a message are outlined.

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n, count = simulation.world_size, len(simulation.snapshots)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.6 * columns, (0.45 * n + 0.9) * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.axis("off")
    for index, (ax, snap) in enumerate(zip(axes.flat, simulation.snapshots, strict=False)):
        ax.imshow(snap.holds.sum(axis=2), cmap="Blues", vmin=0, vmax=n * 1.4, aspect="auto")
        for r in range(n):
            for c in range(n):
                ax.text(c, r, _label(snap.holds[r, c]), ha="center", va="center", fontsize=7)
        for m in snap.step.messages if snap.step else ():
            for c in range(n) if m.chunk == WHOLE else [m.chunk]:
                ax.add_patch(Rectangle((c - 0.5, m.dest - 0.5), 1, 1, fill=False, edgecolor="crimson", lw=1.5))
        title = "start" if snap.step is None else f"step {index}: {snap.step.phase}"
        ax.set_title(title, fontsize=8)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=7)
    fig.suptitle(f"{simulation.algorithm} allreduce on {n} ranks: which inputs each chunk holds "
                 f"(red: just received)", fontsize=9)
    fig.tight_layout()
    return fig
