"""Unit 4b-5 (notebooks 04b, 05): buckets, the distributed optimizer, Horovod's recipe, overlap, DDP's internals
and scripts, the conversion's accuracy, the calibration of this machine and scaling."""

from typing import Any


def __getattr__(name: str) -> Any:
    """What the old ``course/ddp.py`` defined, now in :mod:`course.ddp.internals` (with a DeprecationWarning)."""
    from course import _moved

    return _moved.forward("ddp", name)
