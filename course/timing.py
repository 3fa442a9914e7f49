"""Timings on a shared machine: the median of repeats, with an interval that says how far to trust it.

One timed run on a machine whose cores other processes share can be off by a factor of two; the median of
several repeats is robust to the odd slow one, and a bootstrap interval of that median says how much it
would move on another execution. Every timing a notebook shows goes through here, e.g.::

    t = timing.summarize(step_seconds)           # Estimate: median, 95% interval, repeats
    print(f"one step: {t.format_ms()}")          # "12.3 ms (95% interval 11.8-13.9 ms, 20 repeats)"
    s = timing.ratio(one_rank_seconds, four_rank_seconds)   # a speedup, with its interval
    print(timing.speedup_verdict(s, workers=4))  # says "noise" when it beats what the cores allow

The interval is a percentile bootstrap (resample the repeats with replacement, take the median each time,
keep the middle 95% of those medians), with a fixed seed, so the same repeats always give the same interval.
Notebooks 01-04b time with it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from course.arguments import check_count

#: Bootstrap resamples per interval: enough for a stable 95% interval, cheap (a few ms).
RESAMPLES = 2000


@dataclass(frozen=True)
class Estimate:
    """A median of repeats and its bootstrap interval.

    Attributes:
        median: the median of the repeats (seconds for a timing; a plain ratio for :func:`ratio`).
        low, high: the interval's ends (``low <= median <= high``).
        repeats: how many repeats it rests on.
        confidence: the interval's coverage, e.g. 0.95.
    """

    median: float
    low: float
    high: float
    repeats: int
    confidence: float = 0.95

    def format_ms(self, digits: int = 1) -> str:
        """``"12.3 ms (95% interval 11.8-13.9 ms, 20 repeats)"`` for a timing in seconds."""
        return self._format(1e3, " ms", digits)

    def format_ratio(self, digits: int = 2) -> str:
        """``"1.52x (95% interval 1.31-1.70x, 20 repeats)"`` for a ratio such as a speedup."""
        return self._format(1.0, "x", digits)

    def format_percent(self) -> str:
        """``"33% (95% interval 25-61%, 8 repeats)"`` for a fraction."""
        return self._format(100.0, "%", 0)

    def _format(self, scale: float, unit: str, digits: int) -> str:
        m, lo, hi = (f"{scale * v:.{digits}f}" for v in (self.median, self.low, self.high))
        return f"{m}{unit} ({self.confidence:.0%} interval {lo}-{hi}{unit}, {self.repeats} repeats)"

    def __contains__(self, value: float) -> bool:
        """``1.0 in speedup``: the interval covers the value (so the data cannot tell them apart)."""
        return self.low <= value <= self.high


def _check_samples(name: str, samples: Sequence[float]) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    if values.ndim != 1 or len(values) == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be a non-empty sequence of finite numbers (one per repeat), "
                         f"got {list(samples)!r}.")
    return values


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1 (e.g. 0.95), got {confidence!r}.")


def summarize(samples: Sequence[float], confidence: float = 0.95, seed: int = 0) -> Estimate:
    """The median of ``samples`` and a bootstrap interval of it.

    Args:
        samples: one value per repeat (e.g. seconds per step). One repeat gives a zero-width interval.
        confidence: coverage of the interval. seed: of the resampling (fixed: same samples, same interval).

    Raises:
        ValueError: no samples, a non-finite one, or ``confidence`` outside (0, 1).
    """
    values = _check_samples("samples", samples)
    _check_confidence(confidence)
    medians = np.median(np.random.default_rng(seed).choice(values, (RESAMPLES, len(values))), axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    median = float(np.median(values))
    return Estimate(median, min(float(low), median), max(float(high), median), len(values), confidence)


def ratio(numerator: Sequence[float], denominator: Sequence[float], confidence: float = 0.95,
          seed: int = 0) -> Estimate:
    """median(numerator) / median(denominator), with a bootstrap interval (each side resampled on its own).

    For a speedup pass the baseline's times as ``numerator``: ``ratio(one_rank_s, four_rank_s)`` > 1 means the
    four ranks are faster. The two sides may have different numbers of repeats.

    Raises:
        ValueError: either side empty or non-finite, a denominator median of 0, or a bad ``confidence``.
    """
    top, bottom = _check_samples("numerator", numerator), _check_samples("denominator", denominator)
    _check_confidence(confidence)
    if np.median(bottom) == 0:
        raise ValueError("the denominator's median is 0: a ratio to it is undefined.")
    rng = np.random.default_rng(seed)
    tops = np.median(rng.choice(top, (RESAMPLES, len(top))), axis=1)
    bottoms = np.median(rng.choice(bottom, (RESAMPLES, len(bottom))), axis=1)
    ratios = tops / np.where(bottoms == 0, np.nan, bottoms)
    tail = 100 * (1 - confidence) / 2
    low, high = np.nanpercentile(ratios, [tail, 100 - tail])
    median = float(np.median(top) / np.median(bottom))
    return Estimate(median, min(float(low), median), max(float(high), median), min(len(top), len(bottom)),
                    confidence)


def time_repeats(fn: Callable[[], object], repeats: int = 7, warmup: int = 1) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn()``, after ``warmup`` untimed calls; pass them to :func:`summarize`.

    Raises:
        ValueError: ``repeats`` below 1 or ``warmup`` below 0.
    """
    repeats = check_count("repeats", repeats, unit="number of timed calls")
    warmup = check_count("warmup", warmup, minimum=0, unit="number of untimed calls")
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def max_speedup(workers: int, cores: int | None = None) -> int:
    """The most ``workers`` processes can speed up CPU-bound work on ``cores`` cores: ``min(workers, cores)``."""
    cores = usable_cores() if cores is None else cores
    return min(check_count("workers", workers), check_count("cores", cores))


#: How far a speedup's whole interval must sit from 1x before :func:`speedup_verdict` calls it faster or slower
#: (``1 / margin`` for slower). Inside the band, load on shared cores moves the ratio from run to run by that much.
SPEEDUP_MARGIN = 1.25


def speedup_verdict(speedup: Estimate, workers: int, cores: int | None = None,
                    margin: float = SPEEDUP_MARGIN) -> str:
    """One sentence on a measured speedup: faster, slower, "cannot tell apart", or noise above what the cores allow.

    "faster" only when the whole interval lies above ``margin`` (and "slower" below ``1 / margin``): a run on
    shared cores that lands inside the band says "cannot tell apart", so two runs never give opposite verdicts
    unless their intervals are more than the band apart.

    Args:
        speedup: from :func:`ratio` (baseline time over this time). workers: processes doing the work.
        cores: CPU cores they share (default: this machine's). margin: the band's upper edge, above 1.

    Raises:
        ValueError: ``margin`` not above 1.
    """
    if not margin > 1:
        raise ValueError(f"margin={margin!r}: the band around 1x needs an upper edge above 1, e.g. 1.25.")
    limit = max_speedup(workers, cores)
    cores = usable_cores() if cores is None else cores
    text = f"speedup {speedup.format_ratio()}"
    if speedup.median > limit:
        return (f"{text}: above the {limit}x that {workers} process(es) on {cores} core(s) allow, so it is "
                "noise (the baseline was slowed by other load), not a result")
    if speedup.low > margin or speedup.high < 1 / margin:
        side = "faster" if speedup.low > margin else "slower"
        return (f"{text}: {side} than the baseline in this run (its whole interval lies "
                f"{'above' if side == 'faster' else 'below'} {margin if side == 'faster' else 1 / margin:.2f}x)")
    return (f"{text}: this run cannot tell the two apart (its interval reaches into {1 / margin:.2f}-{margin:.2f}x, "
            "where load on the shared cores moves the ratio from run to run)")


class PhaseClock:
    """Seconds spent in each named phase of each step of a loop, measured where the loop runs.

    ``steps[i]`` maps a phase name (e.g. ``"compute"``, ``"communicate"``) to the seconds step ``i`` spent in
    it; a phase entered twice in one step adds up::

        clock = PhaseClock()
        for batch in batches:
            clock.new_step()
            with clock.phase("compute"): loss.backward()
            with clock.phase("communicate"): allreduce_gradients(model)
        clock.seconds("compute")     # one value per step, ready for summarize()
    """

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self.started: list[float] = []  # time.monotonic() at each new_step(): where each step sits in time

    def new_step(self) -> None:
        self.steps.append({})
        self.started.append(time.monotonic())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.steps:
            raise RuntimeError("PhaseClock.phase() before any step: call new_step() first, once per step.")
        start = time.perf_counter()
        try:
            yield
        finally:
            step = self.steps[-1]
            step[name] = step.get(name, 0.0) + time.perf_counter() - start

    def seconds(self, name: str | None = None) -> list[float]:
        """Per step, the seconds spent in phase ``name`` (0 if a step never entered it), or in all phases."""
        return [sum(step.values()) if name is None else step.get(name, 0.0) for step in self.steps]
