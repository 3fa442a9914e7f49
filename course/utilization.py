"""How busy is each GPU? Sample it: NVML on real GPUs, the rank processes' CPU on emulated ones.

NVIDIA's multi-GPU course keeps ``nvidia-smi`` open next to every run, so you *see* four GPUs busy (or one busy
and three idle, when rank 0 works alone while the others wait for it). This module is the measuring half of that
picture and returns plain data; :mod:`course.monitor` draws it. Used in ``notebooks/05_ddp.ipynb`` and
``notebooks/06_assignment.ipynb``.

Two sources share one signature, ``read(t_s) -> list[Reading]``:

* :class:`NvmlSource` reads **GPU utilization** (the percent of time a kernel was running) and device memory
  through NVML (``nvidia-ml-py``, imported as ``pynvml``): a real GPU measurement.
* :class:`ProcessSource` reads the **CPU% and resident memory of the process emulating each GPU** (psutil),
  found in a process tree: a torchrun worker carries ``LOCAL_RANK`` in its environment. That is a CPU
  measurement of an emulated GPU, and every label says so; it is never passed off as a GPU number.

:class:`Sampler` calls a source every ``interval_s`` seconds in a background thread and appends to a
:class:`History`; :func:`summarize` turns a history into per-device means and busy fractions.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

#: Percent of its fair share at or above which a device counts as busy (see :func:`busy_threshold`).
BUSY_SHARE = 0.5


@dataclass(frozen=True)
class Reading:
    """One device at one moment.

    Attributes:
        t_s: seconds since sampling started.
        device: GPU index (NVML) or local rank (emulated GPU).
        utilization: percent; for an emulated GPU, CPU% of its processes (100 = one core fully used).
        memory_bytes: device memory in use (NVML) or resident memory of its processes (emulated).
    """

    t_s: float
    device: int
    utilization: float
    memory_bytes: int


class Source(Protocol):
    """What a :class:`Sampler` reads: ``kind`` is ``"nvml"`` or ``"process"``."""

    kind: str

    def read(self, t_s: float) -> list[Reading]: ...

    def label(self, device: int) -> str: ...


@dataclass
class History:
    """Every reading of a sampling run, appended by the sampler thread (``list.append`` is atomic).

    Attributes:
        kind: ``"nvml"`` (real GPUs), ``"process"`` (CPU processes emulating GPUs) or ``"modelled"``
            (no measurement: :func:`course.perf_model.to_history` replays a modelled timeline).
        labels: device -> what its numbers mean, e.g. ``"CPU% of the process emulating GPU 2"``.
        readings: in time order.
    """

    kind: str
    labels: dict[int, str] = field(default_factory=dict)
    readings: list[Reading] = field(default_factory=list)

    def devices(self) -> list[int]:
        return sorted({r.device for r in self.readings} | set(self.labels))

    def of(self, device: int) -> list[Reading]:
        return [r for r in self.readings if r.device == device]


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
    it, so the rank is the topmost process with that value. Without any such process, ``root``'s
    multiprocessing children (the ranks of :func:`course.runtime.launch.launch`, which sets ``LOCAL_RANK`` only after
    starting) are ranks in the order they were started.
    """
    ranks: dict[int, psutil.Process] = {}
    spawned: list[tuple[float, int, psutil.Process]] = []
    for process in root.children(recursive=True):
        try:
            local_rank = process.environ().get("LOCAL_RANK")
            if local_rank is None:
                cmdline = process.cmdline()
                if process.ppid() == root.pid and "--multiprocessing-fork" in cmdline \
                        and "resource_tracker" not in " ".join(cmdline):
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


# ---- Sampling in the background ----------------------------------------------------------------------------

class Sampler:
    """Read ``source`` every ``interval_s`` seconds in a daemon thread, appending to ``history``.

    Use as a context manager (or ``start()`` / ``stop()``); ``on_sample(history)`` is called after each read,
    from the sampler thread (the live display hangs on it).

    Raises:
        ValueError: ``interval_s`` is not positive.
    """

    def __init__(self, source: Source, interval_s: float = 0.5,
                 on_sample: Callable[[History], None] | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}; try 0.5.")
        self.source, self.interval_s, self.on_sample = source, interval_s, on_sample
        self.history = History(kind=source.kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="course-utilization-sampler", daemon=True)
        self._start = time.monotonic()

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> list[Reading]:
        """Take one reading of every device now (the thread calls this; tests may call it directly)."""
        try:
            readings = self.source.read(time.monotonic() - self._start)
        except psutil.NoSuchProcess:  # the watched tree ended between two looks: nothing left to read
            readings = []
        for reading in readings:
            self.history.labels.setdefault(reading.device, self.source.label(reading.device))
        self.history.readings.extend(readings)
        if self.on_sample is not None:
            try:
                self.on_sample(self.history)
            except Exception as error:  # a broken display must not stop the measurement
                warnings.warn(f"the live view failed ({error!r}); still sampling, without it", stacklevel=1)
                self.on_sample = None
        return readings

    def start(self) -> Sampler:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> History:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.history

    def __enter__(self) -> History:
        return self.start().history

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- What a history says ------------------------------------------------------------------------------------

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
