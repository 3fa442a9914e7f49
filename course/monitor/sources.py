"""Where utilization readings come from: NVML on real GPUs, the rank processes' CPU on emulated ones.

Two sources share the signature of :class:`course.monitor.sampling.Source`, ``read(t_s) -> list[Reading]``:

* :class:`NvmlSource` reads **GPU utilization** (the percent of time a kernel was running) and device memory
  through NVML (``nvidia-ml-py``, imported as ``pynvml``): a real GPU measurement.
* :class:`ProcessSource` reads the **CPU% and resident memory of the process emulating each GPU** (psutil),
  found in a process tree (:func:`find_ranks`): a torchrun worker carries ``LOCAL_RANK`` in its environment.
  That is a CPU measurement of an emulated GPU, and every label says so; it is never passed off as a GPU number.

:func:`source_for` picks the one that measures what a run uses; :class:`course.monitor.sampling.Sampler` reads it in
the background. Used in ``notebooks/05_ddp.ipynb`` and ``notebooks/06_assignment.ipynb`` through
:mod:`course.monitor.watch`.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from course.monitor.sampling import Reading, Source

# ---- NVML: real GPUs ---------------------------------------------------------------------------------------

def open_nvml(nvml: Any = None) -> tuple[Any | None, str]:
    """Initialise NVML; ``(module, "")`` if it works, ``(None, reason)`` if there is no library or driver.

    Args:
        nvml: an object with pynvml's functions (``nvmlInit``, ...); ``None`` imports ``pynvml``. Tests inject
            a fake here.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        nvml.nvmlInit()
        nvml.nvmlDeviceGetCount()
    except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no usable GPU driver
        return None, f"NVML is not usable here ({type(error).__name__}: {error})"
    return nvml, ""


class NvmlSource:
    """GPU utilization and memory of every GPU NVML sees (NVML's device order, not CUDA_VISIBLE_DEVICES')."""

    kind = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._error = getattr(nvml, "NVMLError", Exception)
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def read(self, t_s: float) -> list[Reading]:
        readings = []
        for device, handle in enumerate(self._handles):
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except self._error:  # e.g. NotSupported on a MIG slice: no reading rather than a made-up one
                continue
            readings.append(Reading(t_s, device, float(rates.gpu), int(memory.used)))
        return readings

    def label(self, device: int) -> str:
        return f"GPU {device} utilization (NVML)"


# ---- Processes: emulated GPUs ------------------------------------------------------------------------------

def find_ranks(root: psutil.Process) -> dict[int, psutil.Process]:
    """The process of each local rank among ``root``'s descendants.

    A torchrun worker has ``LOCAL_RANK`` in its environment; its own children (DataLoader workers) inherit
    it, so the rank is the topmost process with that value. Without any such process, the ranks of
    :func:`course.runtime.launch.launch` (which sets ``LOCAL_RANK`` only after starting, where ``/proc`` does not
    show it) are ranks in the order they were started: ``root``'s spawned children, or the children of the fork
    server ``root`` started.
    """
    ranks: dict[int, psutil.Process] = {}
    spawned: list[tuple[float, int, psutil.Process]] = []
    for process in root.children(recursive=True):
        try:
            local_rank = process.environ().get("LOCAL_RANK")
            if local_rank is None:
                if _started_by_launch(process, root):
                    spawned.append((process.create_time(), process.pid, process))
                continue
            parent = process.parent()
            if parent is None or parent.pid == root.pid or parent.environ().get("LOCAL_RANK") != local_rank:
                ranks.setdefault(int(local_rank), process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            continue
    if not ranks:
        ranks = dict(enumerate(process for _, _, process in sorted(spawned, key=lambda s: s[:2])))
    return ranks


class ProcessSource:
    """CPU% and resident memory of the processes emulating each GPU, found under ``root_pid``.

    A rank's numbers include its children (DataLoader workers): they do that rank's work.
    """

    kind = "process"

    def __init__(self, root_pid: int) -> None:
        try:
            self._root = psutil.Process(root_pid)
            self._root.status()
        except psutil.NoSuchProcess:
            raise ValueError(f"no process with pid {root_pid} to watch: it has already exited (or never existed). "
                             "Pass the pid of a running torchrun (Popen.pid) or launcher.") from None
        self._cpu_s: dict[int, float] = {}  # pid -> CPU seconds at the previous read
        self._last_wall = time.monotonic()

    def read(self, t_s: float) -> list[Reading]:
        now = time.monotonic()
        elapsed = max(now - self._last_wall, 1e-6)
        cpu_s, readings = {}, []
        for local_rank, process in sorted(find_ranks(self._root).items()):
            busy_s, rss = 0.0, 0
            for member in _with_children(process):
                try:
                    with member.oneshot():
                        times, rss_now = member.cpu_times(), member.memory_info().rss
                        created = member.create_time()
                except psutil.Error:
                    continue
                used = times.user + times.system
                cpu_s[member.pid] = used
                # A process born since the last read did all its work in this interval; one seen before only
                # the difference. (A process already running when first seen gets counted from now on.)
                if member.pid in self._cpu_s:
                    busy_s += used - self._cpu_s[member.pid]
                elif created >= time.time() - elapsed:
                    busy_s += used
                rss += rss_now
            readings.append(Reading(t_s, local_rank, 100.0 * max(busy_s, 0.0) / elapsed, rss))
        self._cpu_s, self._last_wall = cpu_s, now
        return readings

    def label(self, device: int) -> str:
        return f"CPU% of the process emulating GPU {device}"


def _started_by_launch(process: psutil.Process, root: psutil.Process) -> bool:
    """``process`` is a rank of :func:`course.runtime.launch.launch` run by ``root``: spawned by it, or forked by the
    fork server it started (a forked rank's command line is the server's)."""
    cmdline = " ".join(process.cmdline())
    parent = process.parent()
    if parent is None:
        return False
    if parent.pid == root.pid:
        return "--multiprocessing-fork" in cmdline and "resource_tracker" not in cmdline
    return parent.ppid() == root.pid and "multiprocessing.forkserver" in cmdline and \
        " ".join(parent.cmdline()) == cmdline


def _with_children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def source_for(root_pid: int, emulated: bool, nvml: Any = None) -> tuple[Source, str]:
    """The source to watch a run with, and a note when it is not the obvious one.

    Args:
        root_pid: the run's top process (torchrun, or the launcher of :func:`course.runtime.launch.launch`).
        emulated: ``course.world.detect_hardware().emulated``: ranks are CPU processes, so NVML would
            measure GPUs the run does not use.
        nvml: passed to :func:`open_nvml` (tests inject a fake).

    Raises:
        ValueError: ``root_pid`` is not a running process.
    """
    processes = ProcessSource(root_pid)  # checks the pid even when NVML will be used
    if emulated:
        return processes, ""
    module, reason = open_nvml(nvml)
    if module is None:
        return processes, f"{reason}: showing the CPU% of each rank's process instead of GPU utilization."
    return NvmlSource(module), ""
