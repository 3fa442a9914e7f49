"""Utilization histories built by hand, for tests of what is computed or drawn from them."""

from __future__ import annotations

from course.monitor.sampling import History, Reading


def history_of(values: dict[int, list[float]], kind: str = "process") -> History:
    """A history with ``values[device]`` as that device's utilization series, one reading every 0.5 s."""
    history = History(kind=kind)
    for device, series in values.items():
        history.labels[device] = f"device {device}"
        history.readings += [Reading(0.5 * i, device, v, int(10 * v)) for i, v in enumerate(series)]
    history.readings.sort(key=lambda r: r.t_s)
    return history
