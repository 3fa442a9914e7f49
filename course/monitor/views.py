"""How a watched run is drawn while it runs: one bar, its numbers and a sparkline per GPU.

In Jupyter, :class:`LiveView` is an ipywidgets panel updated from the sampler thread, so the kernel is never
blocked by it, and replaced by :func:`static_html` when the run ends (widgets do not survive saving a notebook);
elsewhere :class:`TextView` prints a line every few seconds. Views only draw a
:class:`course.monitor.sampling.History`; they measure nothing (:mod:`course.monitor.sampling` does).
:func:`course.monitor.watch.watch`
picks and drives one. Used in ``notebooks/05_ddp.ipynb`` and ``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course.monitor import sampling as utilization
from course.monitor import summary as utilization_summary
from course.monitor.sampling import History

_BLOCKS = " ▁▂▃▄▅▆▇█"
_MIB = 2**20


def sparkline(values: Sequence[float], width: int = 40, top: float = 100.0) -> str:
    """The last ``width`` values as block characters, a space for 0 and a full block for ``top`` or more."""
    scale = len(_BLOCKS) - 1
    return "".join(_BLOCKS[round(min(max(v, 0.0), top) / top * scale)] for v in list(values)[-width:])


def _run_sparkline(history: History, device: int, width: int = 60) -> str:
    """The device's whole run as ``width`` block characters, busy ones green and idle ones grey (HTML).

    Scaled to the device's fair share (:func:`course.monitor.summary.fair_share`): on 4 emulated GPUs sharing
    2 cores, a rank that gets its whole share of the CPU draws a full block, a rank waiting in a collective a low
    one.
    """
    values = [r.utilization for r in history.of(device)]
    if len(values) > width:  # each character: the mean of an equal slice of the run
        values = [sum(chunk) / len(chunk) for chunk in
                  (values[i * len(values) // width:(i + 1) * len(values) // width] for i in range(width))]
    top, threshold = utilization_summary.fair_share(history), utilization_summary.busy_threshold(history)
    return "".join(f'<span style="color:{"#2a8c3c" if v >= threshold else "#9a9a9a"}">{sparkline([v], 1, top)}</span>'
                   for v in values)


def static_html(history: History, elapsed_s: float, stopped: bool = False) -> str:
    """The panel of a finished run as plain HTML: it stays in a saved notebook, where widgets do not."""
    top = utilization_summary.fair_share(history)
    rows = "".join(
        f"<tr><td>GPU {s.device}</td><td>mean {s.mean_utilization:.0f}%</td>"
        f"<td>busy {s.busy_fraction:.0%} of the time</td><td><code>{_run_sparkline(history, s.device)}</code></td></tr>"
        for s in utilization_summary.summarize(history))
    state = "stopped" if stopped else "finished"
    scale = ("" if history.kind != "process" else f" Each bar is scaled to {top:.0f}%, the share of the cores one "
             "emulated GPU can get; green = busy, grey = idle or waiting.")
    return (f"<div><b>{state} after {elapsed_s:.1f} s.</b> {utilization.describe(history.kind)}{scale}"
            f"<table>{rows or '<tr><td>no device was seen</td></tr>'}</table></div>")


class LiveView:
    """An ipywidgets panel: per device a bar, its numbers and a sparkline of its recent history.

    Bars and sparklines are scaled to what one device can reach (on emulated GPUs, its share of the cores) and
    busy readings are green, idle ones grey. :meth:`finish` replaces the panel by :func:`static_html`.
    """

    def __init__(self, kind: str, note: str = "") -> None:
        import ipywidgets as widgets

        self._widgets = widgets
        header = utilization.describe(kind) + (f"<br><i>{note}</i>" if note else "")
        self.header = widgets.HTML(f"<b>{header}</b>")
        self.rows: dict[int, tuple[Any, Any, Any]] = {}  # device -> (bar, numbers, sparkline)
        self.panel = widgets.VBox([self.header])
        self._handle: Any = None

    def _row(self, device: int, label: str) -> tuple[Any, Any, Any]:
        w = self._widgets
        bar = w.FloatProgress(min=0.0, max=100.0, description=f"GPU {device}",
                              layout=w.Layout(width="340px"), tooltip=label)
        numbers, spark = w.HTML(layout=w.Layout(width="150px")), w.HTML()
        self.rows[device] = (bar, numbers, spark)
        self.panel.children = [self.header, *(w.HBox(self.rows[d]) for d in sorted(self.rows))]
        return self.rows[device]

    def update(self, history: History) -> None:
        top = utilization_summary.fair_share(history)
        for device in history.devices():
            readings = history.of(device)
            if not readings:
                continue
            bar, numbers, spark = self.rows.get(device) or self._row(device, history.labels[device])
            last = readings[-1]
            bar.max = top
            bar.value = min(last.utilization, top)
            bar.bar_style = "success" if last.utilization >= utilization_summary.busy_threshold(history) else ""
            numbers.value = f"{last.utilization:5.0f}% · {last.memory_bytes / _MIB:,.0f} MiB"
            spark.value = f"<code>{_run_sparkline(history, device, width=40)}</code>"

    def show(self) -> None:
        from IPython.display import display

        self._handle = display(self.panel, display_id=True)

    def finish(self, history: History, elapsed_s: float, stopped: bool = False) -> None:
        """Replace the live panel by the run's static summary, which survives saving and reopening."""
        from IPython.display import HTML

        html = static_html(history, elapsed_s, stopped)
        self.header.value = html
        if self._handle is not None:
            self._handle.update(HTML(html))


class TextView:
    """Outside Jupyter: a line of every device's numbers every ``every_s`` seconds."""

    def __init__(self, kind: str, note: str = "", every_s: float = 5.0) -> None:
        self.every_s, self._next_t = every_s, 0.0
        print(utilization.describe(kind) + (f" {note}" if note else ""), flush=True)

    def update(self, history: History) -> None:
        if not history.readings or history.readings[-1].t_s < self._next_t:
            return
        t_s = history.readings[-1].t_s
        self._next_t = t_s + self.every_s
        cells = [f"GPU {r.device} {r.utilization:4.0f}% {r.memory_bytes / _MIB:5.0f} MiB"
                 for r in history.readings if r.t_s == t_s]
        print(f"{t_s:6.1f} s | " + " | ".join(cells), flush=True)

    def show(self) -> None:
        pass

    def finish(self, history: History, elapsed_s: float, stopped: bool = False) -> None:
        print(f"{'stopped' if stopped else 'finished'} after {elapsed_s:.1f} s", flush=True)


def in_jupyter() -> bool:
    """True inside an IPython kernel (Jupyter, or nbval, which runs one without a frontend)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None
