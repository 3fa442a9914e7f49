"""Your schedule's bubble beside the closed form: the 1F1B lab's schedule simulated and drawn (notebook 08).

:func:`simulate_yours` loads the lab file, asks its ``one_f_one_b(p, m, stage)`` for every stage and simulates
the stages together (:func:`course.model_parallel.schedules.simulate`: equal stages, a backward twice a forward).
:func:`plot_yours` draws that timeline and, beside it, its idle share next to ``(p-1)/(m+p-1)``. A file whose
function is not written yet draws the course's own 1F1B, and says so; a schedule that deadlocks is named with who
waits for whom, instead of a timeline.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from course.model_parallel import schedules
from course.model_parallel.bubble import bubble_fraction, measured_bubble, plot_timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class YourBubble:
    """What the simulation of a schedule found: its timeline (empty on a deadlock) and whose schedule it is."""

    whose: str  # "your one_f_one_b" or "the course's 1F1B (yours is not written yet)"
    events: list
    closed_form: float
    deadlock: str = ""

    @property
    def bubble(self) -> float | None:
        return measured_bubble(self.events) if self.events else None


def simulate_yours(path: str, num_stages: int, num_micro_batches: int) -> YourBubble:
    """Simulate the ``one_f_one_b`` of the lab file at ``path`` on ``num_stages`` stages."""
    spec = importlib.util.spec_from_file_location("your_one_f_one_b", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    closed = bubble_fraction(num_stages, num_micro_batches)
    try:
        module.one_f_one_b(num_stages, num_micro_batches, 0)
    except NotImplementedError:
        events = schedules.simulate(schedules.one_f_one_b, num_stages, num_micro_batches)
        return YourBubble("the course's 1F1B (yours is not written yet)", events, closed)

    def yours(p: int, m: int, stage: int) -> list[schedules.Op]:
        return [schedules.Op(str(op[0]), int(op[1])) for op in module.one_f_one_b(p, m, stage)]

    try:
        return YourBubble("your one_f_one_b", schedules.simulate(yours, num_stages, num_micro_batches), closed)
    except schedules.Deadlock as error:
        return YourBubble("your one_f_one_b", [], closed, "; ".join(error.waits))


def plot_yours(found: YourBubble) -> Figure:
    """The timeline of ``found`` and, beside it, its simulated bubble next to the closed form."""
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 2.6), gridspec_kw={"width_ratios": [4, 1]})
    if found.events:
        plot_timeline(found.events, ax=left, title=f"{found.whose}, simulated")
        right.bar(["simulated", "(p-1)/(m+p-1)"], [found.bubble, found.closed_form], color=["tab:blue", "tab:gray"])
    else:
        left.text(0.01, 0.5, f"{found.whose} deadlocks:\n{found.deadlock}", va="center", wrap=True, fontsize=8)
        left.set_axis_off()
        right.bar(["(p-1)/(m+p-1)"], [found.closed_form], color="tab:gray")
    right.set_ylabel("bubble")
    right.set_title("idle share of the step")
    figure.tight_layout()
    return figure
