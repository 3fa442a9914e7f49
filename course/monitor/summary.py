"""What a utilization history says: per device, the mean utilization, the share of time busy, peak memory.

"Busy" is measured against what a device can reach (:func:`fair_share`): 100% for a GPU, but only
``100 * cpu_count / world_size`` percent for each of ``world_size`` processes emulating GPUs on ``cpu_count``
cores, so a rank that works all the time on a shared CPU counts as busy and one waiting in a collective does not.
Pure functions of a :class:`course.monitor.sampling.History`; :mod:`course.monitor.summary_plot` prints and plots them.
Used in ``notebooks/05_ddp.ipynb`` and ``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from course.monitor.sampling import History

#: Percent of its fair share at or above which a device counts as busy (see :func:`busy_threshold`).
BUSY_SHARE = 0.5


@dataclass(frozen=True)
class DeviceSummary:
    """One device over a run: ``busy_fraction`` is the share of its readings at or above ``busy_threshold``."""

    device: int
    label: str
    mean_utilization: float
    busy_fraction: float
    busy_threshold: float
    peak_memory_bytes: int
    readings: int


def fair_share(history: History, cpu_count: int | None = None) -> float:
    """The most utilization (percent) one device of ``history`` can show: 100 for a GPU.

    Emulated GPUs share the CPU: ``world_size`` processes on ``cpu_count`` cores get at most
    ``100 * cpu_count / world_size`` percent each (4 on 2 cores: 50%).
    """
    if history.kind in ("nvml", "modelled"):  # a real or modelled GPU can reach 100%
        return 100.0
    return 100.0 * min(1.0, (cpu_count or os.cpu_count() or 1) / max(1, len(history.devices())))


def busy_threshold(history: History, cpu_count: int | None = None) -> float:
    """The utilization (percent) at or above which a device counts as busy: half of its :func:`fair_share`.

    A GPU can reach 100%, so the bar is 50%; 4 emulated GPUs on 2 cores, 25%. Otherwise a rank that works all
    the time on a shared CPU could never count as busy.
    """
    return fair_share(history, cpu_count) * BUSY_SHARE


def summarize(history: History, threshold: float | None = None) -> list[DeviceSummary]:
    """Mean utilization, fraction of time busy and peak memory of every device in ``history``.

    Args:
        threshold: utilization (percent) that counts as busy; ``None``: :func:`busy_threshold`.

    Readings come at a fixed interval, so a fraction of readings is a fraction of time. A device with no
    readings yet has mean 0 and busy fraction 0.
    """
    threshold = busy_threshold(history) if threshold is None else threshold
    summaries = []
    for device in history.devices():
        values = [r.utilization for r in history.of(device)]
        memory = [r.memory_bytes for r in history.of(device)]
        n = len(values)
        summaries.append(DeviceSummary(
            device=device, label=history.labels.get(device, f"device {device}"),
            mean_utilization=sum(values) / n if n else 0.0,
            busy_fraction=sum(v >= threshold for v in values) / n if n else 0.0,
            busy_threshold=threshold, peak_memory_bytes=max(memory, default=0), readings=n,
        ))
    return summaries
