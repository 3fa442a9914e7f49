"""The pipeline bubble: how much of a GPipe step each stage sits idle, in closed form and on a timeline.

A pipeline of ``p`` stages (``course.model_parallel.two_stage``) runs ``m`` micro-batches forward, then backward. Each
stage
waits for the one before it, so with equal stages it is idle ``(p-1)/(m+p-1)`` of the time
(:func:`bubble_fraction`); measured against the busy time instead of the step, the same idle time is
``(p-1)/m`` (:func:`bubble_ratio`). :func:`modelled_timeline` builds the ideal schedule as :class:`Event` s,
:func:`measured_bubble` counts the idle fraction of any timeline (modelled, or recorded by
``model_parallel.pipeline_step``) and :func:`plot_timeline` draws it as a Gantt chart.
Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from course import exercise
from course.arguments import check_count

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class Event:
    """One stage computing one micro-batch: ``kind`` is ``"F"`` (forward) or ``"B"`` (backward); seconds.
    ``chunk``: which of the stage's model chunks (interleaved 1F1B gives each stage several; 0 otherwise)."""

    stage: int
    kind: str
    micro_batch: int
    start: float
    end: float
    chunk: int = 0


def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    """Idle fraction of a GPipe schedule with equal stages: ``(p-1)/(m+p-1)``.

    Raises:
        ValueError: fewer than one stage or micro-batch.
    """
    num_stages = check_count("num_stages", num_stages, unit="number of stages (p)")
    num_micro_batches = check_count("num_micro_batches", num_micro_batches, unit="number of micro-batches (m)")
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def bubble_ratio(num_stages: int, num_micro_batches: int) -> float:
    """The same idle time measured against the work instead of the step: ``(p-1)/m``.

    Two conventions name one bubble. Each stage is busy for ``m`` micro-batch-times and idle for ``p-1``; over
    the whole step (``m+p-1``) the idle share is :func:`bubble_fraction`, over the work alone it is ``(p-1)/m``
    (Narayanan et al. 2021 write it this way). ``fraction = ratio / (1 + ratio)``.

    Raises:
        ValueError: fewer than one stage or micro-batch.
    """
    bubble_fraction(num_stages, num_micro_batches)  # validates
    return (num_stages - 1) / num_micro_batches


def modelled_timeline(num_stages: int, num_micro_batches: int, forward_s: float, backward_s: float) -> list[Event]:
    """The ideal GPipe schedule: stage s runs forward of micro-batch i at ``(i+s)·t_f``, then backwards in reverse.

    Args:
        forward_s, backward_s: one stage's time for one micro-batch's forward and backward.
    """
    p, m = num_stages, num_micro_batches
    bubble_fraction(p, m)  # validates
    forward_end = (m + p - 1) * forward_s
    events = [Event(s, "F", i, (i + s) * forward_s, (i + s + 1) * forward_s) for s in range(p) for i in range(m)]
    events += [Event(s, "B", m - 1 - j, forward_end + (j + p - 1 - s) * backward_s,
                     forward_end + (j + p - s) * backward_s) for s in range(p) for j in range(m)]
    return events


def measured_bubble(events: Sequence[Event]) -> float:
    """Idle fraction of a timeline: ``1 - busy time / (stages x span)``."""
    stages = {e.stage for e in events}
    span = max(e.end for e in events) - min(e.start for e in events)
    return 1.0 - sum(e.end - e.start for e in events) / (len(stages) * span)


def plot_timeline(events: Sequence[Event], ax: Axes | None = None, title: str = "") -> Axes:
    """Gantt chart: one row per stage, a bar per forward (blue) and backward (orange) of each micro-batch.
    With several model chunks per stage (interleaved 1F1B), each bar also names its chunk (``F3/1``: forward of
    micro-batch 3 on chunk 1), and the chunks after the first are hatched."""
    import matplotlib.pyplot as plt
    from matplotlib.patheffects import withStroke

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.2))
    colors = {"F": "tab:blue", "B": "tab:orange"}
    chunked = any(e.chunk for e in events)
    for e in events:
        bar = [(1e3 * e.start, 1e3 * (e.end - e.start))], (e.stage - 0.4, 0.8)
        ax.broken_barh(*bar, facecolor=colors[e.kind], edgecolor="white")
        if e.chunk:  # white stripes, on a layer of their own (a bar drawn with color= colours its hatch too)
            ax.broken_barh(*bar, facecolor="none", edgecolor="white", linewidth=0, hatch="//")
        narrow = e.end - e.start < 0.03 * max(x.end for x in events)  # a narrow bar's label stands upright
        label = f"{e.kind}{e.micro_batch}" + (f"/{e.chunk}" if chunked else "")
        ax.text(1e3 * (e.start + e.end) / 2, e.stage, label, ha="center", va="center", color="white",
                fontsize=6 if narrow or chunked else 8, rotation=90 if narrow else 0,
                path_effects=[withStroke(linewidth=2, foreground=colors[e.kind])])  # stripes kept off the label
    stages = sorted({e.stage for e in events})
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    from matplotlib.patches import Patch

    suffix = "/<chunk>" if chunked else ""
    handles = [Patch(color=colors["F"], label=f"forward (F<micro-batch>{suffix})"),
               Patch(color=colors["B"], label=f"backward (B<micro-batch>{suffix})")]
    if chunked:
        handles.append(Patch(facecolor="white", edgecolor="gray", hatch="//", label="a later chunk (1, 2, ...)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title or f"bubble {measured_bubble(events):.0%}")
    return ax


@exercise.checker
def check_bubble_exercise(bubble: Callable[[int, int], float]) -> bool:
    """Exercise checker: does ``bubble(num_stages, num_micro_batches)`` give a GPipe schedule's idle fraction?

    Compares with the idle fraction counted on :func:`modelled_timeline` for 1-6 stages and 1-16 micro-batches
    and prints the first case that differs. Used in notebook 03.

    Returns:
        True if every case matches to 1e-9.
    """
    for p in range(1, 7):
        for m in range(1, 17):
            counted = measured_bubble(modelled_timeline(p, m, 1.0, 2.0))
            got = bubble(p, m)
            if not isinstance(got, (int, float)) or abs(got - counted) > 1e-9:
                print(f"Not yet: with {p} stages and {m} micro-batches the timeline is idle {counted:.4f} of the "
                      f"time, your function says {got!r}. Hint: count the time slots from the first forward to the "
                      "last backward, and how many of them each stage is busy.")
                return False
    print("Correct: your formula matches the counted timeline for 1-6 stages and 1-16 micro-batches.")
    return True
