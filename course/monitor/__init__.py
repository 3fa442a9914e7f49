"""Watching a run like ``nvidia-smi``: sampling (the history and its sampler), sources (NVML, rank CPU),
summary (what a history says), views (the live panel), summary_plot (after the run) and watch (all of it)."""

from typing import Any


def __getattr__(name: str) -> Any:
    """What the old ``course/monitor.py`` defined, now in :mod:`course.monitor.watch` (with a DeprecationWarning)."""
    from course import _moved

    return _moved.forward("monitor", name)
