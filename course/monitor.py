"""Watch a multi-GPU run live: one bar per GPU while it runs, a summary and a timeline after.

The notebook version of keeping ``nvidia-smi`` open next to a run. :mod:`course.utilization` measures (NVML on
real GPUs, the CPU% of each rank's process on emulated ones); this module only shows what it measured::

    run = monitor.run_and_watch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node=4", "train_4gpu.py"], cwd="runs")
    print(run.stdout)
    monitor.report(run.history)        # mean utilization and busy time per GPU, and the timeline

or around a process you started yourself: ``with monitor.watch(popen) as history: popen.wait()``.
In Jupyter the live view is an ipywidgets panel, updated from the sampler thread, so the kernel is never
blocked by it; elsewhere it prints a line every few seconds. Used in ``notebooks/05_ddp.ipynb`` and
``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from course import utilization, world
from course.runtime import process
from course.runtime.process_tree import kill_tree
from course.utilization import DeviceSummary, History

_BLOCKS = " ▁▂▃▄▅▆▇█"
_MIB = 2**20


def sparkline(values: Sequence[float], width: int = 40, top: float = 100.0) -> str:
    """The last ``width`` values as block characters, a space for 0 and a full block for ``top`` or more."""
    scale = len(_BLOCKS) - 1
    return "".join(_BLOCKS[round(min(max(v, 0.0), top) / top * scale)] for v in list(values)[-width:])


def _title(kind: str) -> str:
    if kind == "nvml":
        return "GPU utilization (NVML), %"
    if kind == "modelled":
        return "modelled GPUs (course.perf_model): percent of time computing, not a measurement"
    return "emulated GPUs: CPU% of each rank's process (100% = one core), not a GPU measurement"


def _describe(kind: str) -> str:
    if kind == "nvml":
        return "GPU utilization (NVML): percent of time a kernel ran on each GPU."
    if kind == "modelled":
        return ("Modelled GPUs: percent of each interval a GPU computes in the performance model "
                "(course.perf_model.to_history). Not a measurement.")
    return ("Emulated GPUs: CPU% of the process emulating each GPU (100% = one core busy), measured with "
            "psutil. Not a GPU measurement.")


def _run_sparkline(history: History, device: int, width: int = 60) -> str:
    """The device's whole run as ``width`` block characters, busy ones green and idle ones grey (HTML).

    Scaled to the device's fair share (:func:`course.utilization.fair_share`): on 4 emulated GPUs sharing 2 cores,
    a rank that gets its whole share of the CPU draws a full block, a rank waiting in a collective a low one.
    """
    values = [r.utilization for r in history.of(device)]
    if len(values) > width:  # each character: the mean of an equal slice of the run
        values = [sum(chunk) / len(chunk) for chunk in
                  (values[i * len(values) // width:(i + 1) * len(values) // width] for i in range(width))]
    top, threshold = utilization.fair_share(history), utilization.busy_threshold(history)
    return "".join(f'<span style="color:{"#2a8c3c" if v >= threshold else "#9a9a9a"}">{sparkline([v], 1, top)}</span>'
                   for v in values)


def static_html(history: History, elapsed_s: float, stopped: bool = False) -> str:
    """The panel of a finished run as plain HTML: it stays in a saved notebook, where widgets do not."""
    top = utilization.fair_share(history)
    rows = "".join(
        f"<tr><td>GPU {s.device}</td><td>mean {s.mean_utilization:.0f}%</td>"
        f"<td>busy {s.busy_fraction:.0%} of the time</td><td><code>{_run_sparkline(history, s.device)}</code></td></tr>"
        for s in utilization.summarize(history))
    state = "stopped" if stopped else "finished"
    scale = ("" if history.kind != "process" else f" Each bar is scaled to {top:.0f}%, the share of the cores one "
             "emulated GPU can get; green = busy, grey = idle or waiting.")
    return (f"<div><b>{state} after {elapsed_s:.1f} s.</b> {_describe(history.kind)}{scale}"
            f"<table>{rows or '<tr><td>no device was seen</td></tr>'}</table></div>")


class LiveView:
    """An ipywidgets panel: per device a bar, its numbers and a sparkline of its recent history.

    Bars and sparklines are scaled to what one device can reach (on emulated GPUs, its share of the cores) and
    busy readings are green, idle ones grey. :meth:`finish` replaces the panel by :func:`static_html`.
    """

    def __init__(self, kind: str, note: str = "") -> None:
        import ipywidgets as widgets

        self._widgets = widgets
        header = _describe(kind) + (f"<br><i>{note}</i>" if note else "")
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
        top = utilization.fair_share(history)
        for device in history.devices():
            readings = history.of(device)
            if not readings:
                continue
            bar, numbers, spark = self.rows.get(device) or self._row(device, history.labels[device])
            last = readings[-1]
            bar.max = top
            bar.value = min(last.utilization, top)
            bar.bar_style = "success" if last.utilization >= utilization.busy_threshold(history) else ""
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
        print(_describe(kind) + (f" {note}" if note else ""), flush=True)

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


def _in_jupyter() -> bool:
    """True inside an IPython kernel (Jupyter, or nbval, which runs one without a frontend)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


@contextlib.contextmanager
def watch(target: subprocess.Popen | int | None = None, interval_s: float = 0.5, display: bool = True,
          nvml: Any = None) -> Iterator[History]:
    """Sample the run's devices in the background while the ``with`` body runs; yields the live history.

    Args:
        target: a running ``subprocess.Popen`` (torchrun), a pid, or ``None`` for this process's own children
            (wrap a blocking call that starts the ranks: :func:`course.runtime.launch.launch`, or
            :func:`course.ddp.run_torchrun`).
        interval_s: seconds between readings.
        display: show the live view (widgets in Jupyter, text lines elsewhere); ``False`` only records.
        nvml: a pynvml-like module to use instead of ``pynvml`` (tests inject a fake one).

    If the body raises (a timeout, Ctrl-C) and ``target`` is a ``Popen``, its whole process tree is killed.

    Raises:
        ValueError: ``target`` is not running, or ``interval_s`` is not positive.
    """
    pid = os.getpid() if target is None else target if isinstance(target, int) else target.pid
    source, note = utilization.source_for(pid, world.detect_hardware().emulated, nvml)
    sampler = utilization.Sampler(source, interval_s)
    view = None
    if display:
        view = LiveView(source.kind, note) if _in_jupyter() else TextView(source.kind, note)
        view.show()
        sampler.on_sample = view.update
    start, stopped = time.monotonic(), True
    try:
        with sampler as history:
            yield history
        stopped = False
    except BaseException:
        if isinstance(target, subprocess.Popen):
            kill_tree(target)
        raise
    finally:
        if view is not None:
            view.finish(sampler.history, time.monotonic() - start, stopped)


@dataclass
class WatchedRun:
    """A finished run (``process``: returncode, stdout, stderr) and the utilization ``history`` beside it."""

    process: subprocess.CompletedProcess
    history: History

    @property
    def returncode(self) -> int:
        return self.process.returncode

    @property
    def stdout(self) -> str:
        return self.process.stdout

    @property
    def stderr(self) -> str:
        return self.process.stderr

    def summary(self, threshold: float | None = None) -> list[DeviceSummary]:
        return utilization.summarize(self.history, threshold)


def run_and_watch(argv: Sequence[str], cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                  timeout_s: float = 600.0, interval_s: float = 0.5, display: bool = True,
                  nvml: Any = None) -> WatchedRun:
    """Run ``argv`` (e.g. a torchrun command) to the end with its output captured, watching its devices.

    Like ``subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)``, plus the utilization
    history. The run gets its own process group; on a timeout or Ctrl-C its whole tree is killed.

    Returns:
        A :class:`WatchedRun`: ``.returncode``, ``.stdout``, ``.stderr``, ``.history``, ``.summary()``.

    Raises:
        subprocess.TimeoutExpired: still running after ``timeout_s`` (the tree was killed first).
        ValueError: ``interval_s`` or ``timeout_s`` is not positive.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    if not interval_s > 0:  # checked before anything starts, not by the sampler once the run is under way
        raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}; try 0.5.")
    running = process.Running(argv, cwd=cwd, env=env)  # its own session; output read aside, uncapped
    try:
        with watch(running.process, interval_s, display, nvml) as history:
            outcome = running.finish(timeout_s)  # nothing the run started outlives it, even after a clean exit
            if outcome.status == "timeout":
                raise subprocess.TimeoutExpired(list(argv), timeout_s, outcome.stdout, outcome.stderr)
    finally:
        running.kill()  # a Ctrl-C in the sampler's start-up, before finish() began
    done = subprocess.CompletedProcess(list(argv), outcome.returncode, outcome.stdout, outcome.stderr)
    return WatchedRun(done, history)


def format_summary(history: History, threshold: float | None = None) -> str:
    """One line per device: mean utilization, fraction of the time busy, peak memory; first, what was measured."""
    lines = [_describe(history.kind)]
    devices, cores = len(history.devices()), os.cpu_count() or 1
    if history.kind == "process" and threshold is None and devices > cores:
        lines.append(f"{devices} processes share {cores} core(s), so each can get {100 * cores / devices:.0f}% at "
                     "most; busy means at least half of that.")
    for s in utilization.summarize(history, threshold):
        memory = "" if history.kind == "modelled" else f", peak memory {s.peak_memory_bytes / _MIB:,.0f} MiB"
        lines.append(f"{s.label}: mean {s.mean_utilization:.0f}%, busy (>= {s.busy_threshold:.0f}%) "
                     f"{s.busy_fraction:.0%} of {s.readings} readings{memory}")
    if len(lines) == 1:
        lines.append("no device was seen: the run ended before its ranks started, or it has none.")
    return "\n".join(lines)


def plot_timeline(history: History, threshold: float | None = None) -> Any:
    """A matplotlib figure: each device's utilization over time, one row per device, the busy line dashed.

    ``threshold``: as in :func:`course.utilization.summarize`.
    """
    import matplotlib.pyplot as plt

    threshold = utilization.busy_threshold(history) if threshold is None else threshold
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


def report(history: History, threshold: float | None = None) -> None:
    """Print :func:`format_summary` and, in Jupyter, show :func:`plot_timeline` under it."""
    import matplotlib.pyplot as plt

    print(format_summary(history, threshold))
    fig = plot_timeline(history, threshold)
    if _in_jupyter():
        plt.show()
    else:  # a script has nowhere to show it; plot_timeline is there to save one
        plt.close(fig)
