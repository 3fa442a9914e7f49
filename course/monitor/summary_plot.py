"""After a watched run: how busy each GPU was, as a line of text per GPU and a timeline plot.

:func:`show` prints :func:`format_summary` (mean utilization, share of the time busy, peak memory, from
:func:`course.monitor.summary.summarize`) and shows :func:`plot_timeline` under it::

    run = monitor.run_and_watch([...])
    summary_plot.show(run.history)

Used in ``notebooks/05_ddp.ipynb`` and ``notebooks/06_assignment.ipynb``; :func:`course.naive.who_works.plot_monitor`
shades the runs of ``notebooks/03_naive_multi_gpu.ipynb`` on :func:`plot_timeline`.
"""

from __future__ import annotations

import os
from typing import Any

from course.monitor import sampling as utilization
from course.monitor import summary as utilization_summary
from course.monitor import views as monitor_views
from course.monitor.sampling import History

_MIB = 2**20


def _title(kind: str) -> str:
    if kind == "nvml":
        return "GPU utilization (NVML), %"
    if kind == "modelled":
        return "modelled GPUs (course.perf.model): percent of time computing, not a measurement"
    return "emulated GPUs: CPU% of each rank's process (100% = one core), not a GPU measurement"


def format_summary(history: History, threshold: float | None = None) -> str:
    """One line per device: mean utilization, fraction of the time busy, peak memory; first, what was measured."""
    lines = [utilization.describe(history.kind)]
    devices, cores = len(history.devices()), os.cpu_count() or 1
    if history.kind == "process" and threshold is None and devices > cores:
        lines.append(f"{devices} processes share {cores} core(s), so each can get {100 * cores / devices:.0f}% at "
                     "most; busy means at least half of that.")
    for s in utilization_summary.summarize(history, threshold):
        memory = "" if history.kind == "modelled" else f", peak memory {s.peak_memory_bytes / _MIB:,.0f} MiB"
        lines.append(f"{s.label}: mean {s.mean_utilization:.0f}%, busy (>= {s.busy_threshold:.0f}%) "
                     f"{s.busy_fraction:.0%} of {s.readings} readings{memory}")
    if len(lines) == 1:
        lines.append("no device was seen: the run ended before its ranks started, or it has none.")
    return "\n".join(lines)


def plot_timeline(history: History, threshold: float | None = None) -> Any:
    """A matplotlib figure: each device's utilization over time, one row per device, the busy line dashed.

    ``threshold``: as in :func:`course.monitor.summary.summarize`.
    """
    import matplotlib.pyplot as plt

    threshold = utilization_summary.busy_threshold(history) if threshold is None else threshold
    devices = history.devices() or [0]
    top = max([100.0, *(r.utilization for r in history.readings)])
    fig, axes = plt.subplots(len(devices), 1, sharex=True, squeeze=False,
                             figsize=(8, 0.9 + 0.8 * len(devices)))
    for ax, device in zip(axes[:, 0], devices, strict=True):
        readings = history.of(device)
        t_s, values = [r.t_s for r in readings], [r.utilization for r in readings]
        # A reading at t covers the interval that ends at t.
        ax.fill_between(t_s, values, step="pre", alpha=0.6)
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel(f"GPU {device}", rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.suptitle(_title(history.kind), fontsize=10)
    fig.tight_layout()
    return fig


def show(history: History, threshold: float | None = None) -> None:
    """Print :func:`format_summary` and, in Jupyter, show :func:`plot_timeline` under it."""
    import matplotlib.pyplot as plt

    print(format_summary(history, threshold))
    fig = plot_timeline(history, threshold)
    if monitor_views.in_jupyter():
        plt.show()
    else:  # a script has nowhere to show it; plot_timeline is there to save one
        plt.close(fig)

