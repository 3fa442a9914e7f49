"""How busy is each GPU? A history of readings, and the sampler thread that fills it while a run goes on.

NVIDIA's multi-GPU course keeps ``nvidia-smi`` open next to every run, so you *see* four GPUs busy (or one busy
and three idle, when rank 0 works alone while the others wait for it). This module is the measuring loop of that
picture and returns plain data: a :class:`Sampler` calls a :class:`Source` every ``interval_s`` seconds in a
background thread and appends its :class:`Reading` s to a :class:`History`. Used in ``notebooks/05_ddp.ipynb`` and
``notebooks/06_assignment.ipynb``.

Where readings come from (NVML on real GPUs, the rank processes' CPU on emulated ones) is
:mod:`course.monitor.sources`; what a history says (means, busy time) is :mod:`course.monitor.summary`;
:mod:`course.monitor.watch` watches a run with all of it and draws the result.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psutil


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
    """What a :class:`Sampler` reads: ``kind`` is ``"nvml"`` or ``"process"``.

    The two sources that share this signature are in :mod:`course.monitor.sources`.
    """

    kind: str

    def read(self, t_s: float) -> list[Reading]: ...

    def label(self, device: int) -> str: ...


@dataclass
class History:
    """Every reading of a sampling run, appended by the sampler thread (``list.append`` is atomic).

    Attributes:
        kind: ``"nvml"`` (real GPUs), ``"process"`` (CPU processes emulating GPUs) or ``"modelled"``
            (no measurement: :func:`course.perf.model.to_history` replays a modelled timeline).
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


def describe(kind: str) -> str:
    """What the numbers of a :class:`History` of this ``kind`` are, in a sentence a reader sees before them.

    Every view of a history starts with it, so a CPU% of an emulated GPU is never read as a GPU measurement.
    """
    if kind == "nvml":
        return "GPU utilization (NVML): percent of time a kernel ran on each GPU."
    if kind == "modelled":
        return ("Modelled GPUs: percent of each interval a GPU computes in the performance model "
                "(course.perf.model.to_history). Not a measurement.")
    return ("Emulated GPUs: CPU% of the process emulating each GPU (100% = one core busy), measured with "
            "psutil. Not a GPU measurement.")


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
