"""Watch a multi-GPU run live: sample each GPU in the background while it runs, and draw it.

The notebook version of keeping ``nvidia-smi`` open next to a run. :mod:`course.monitor.sources` measures
(NVML on real GPUs, the CPU% of each rank's process on emulated ones), a :class:`course.monitor.sampling.Sampler`
records, :mod:`course.monitor.views` draws; this module runs and watches::

    run = monitor.run_and_watch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node=4", "train_4gpu.py"], cwd="runs")
    print(run.stdout)
    summary_plot.show(run.history)  # mean utilization and busy time per GPU, and the timeline

or around a process you started yourself: ``with monitor.watch(popen) as history: popen.wait()``.
Used in ``notebooks/05_ddp.ipynb`` and ``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from course import world
from course.monitor import sampling as utilization
from course.monitor import sources as utilization_sources
from course.monitor import summary as utilization_summary
from course.monitor import views as monitor_views
from course.monitor.sampling import History
from course.monitor.summary import DeviceSummary
from course.runtime import process
from course.runtime.process_tree import kill_tree


@contextlib.contextmanager
def watch(target: subprocess.Popen | int | None = None, interval_s: float = 0.5, display: bool = True,
          nvml: Any = None) -> Iterator[History]:
    """Sample the run's devices in the background while the ``with`` body runs; yields the live history.

    Args:
        target: a running ``subprocess.Popen`` (torchrun), a pid, or ``None`` for this process's own children
            (wrap a blocking call that starts the ranks: :func:`course.runtime.launch.launch`, or
            :func:`course.ddp.scripts.run_torchrun`).
        interval_s: seconds between readings.
        display: show the live view (widgets in Jupyter, text lines elsewhere); ``False`` only records.
        nvml: a pynvml-like module to use instead of ``pynvml`` (tests inject a fake one).

    If the body raises (a timeout, Ctrl-C) and ``target`` is a ``Popen``, its whole process tree is killed.

    Raises:
        ValueError: ``target`` is not running, or ``interval_s`` is not positive.
    """
    pid = os.getpid() if target is None else target if isinstance(target, int) else target.pid
    source, note = utilization_sources.source_for(pid, not world.gpus_present(), nvml)
    if source.kind == "nvml" and world.detect_hardware().emulated:
        note = (f"{note} The GPUs are shown, but {world.EMULATE_ENV}=1 runs the ranks on the CPU: "
                "this run leaves them idle.").strip()
    sampler = utilization.Sampler(source, interval_s)
    view = None
    if display:
        view_class = monitor_views.LiveView if monitor_views.in_jupyter() else monitor_views.TextView
        view = view_class(source.kind, note)
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
        return utilization_summary.summarize(self.history, threshold)


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
