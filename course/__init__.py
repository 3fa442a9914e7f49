"""multigpu-course: teaching primitives for training one network on several GPUs (real or emulated).

The folders follow the course (docs/contributing.md, "Where things are"); a student script imports the top level:
:mod:`~course.world`, :mod:`~course.data`, :mod:`~course.models`, :mod:`~course.train`, :mod:`~course.report`.
"""

from typing import Any

from course import _moved

__version__ = "0.1.0"

_moved.install()


def __getattr__(name: str) -> Any:
    """``from course import allreduce`` (an old path): the moved module, with a DeprecationWarning."""
    return _moved.from_course(name)
