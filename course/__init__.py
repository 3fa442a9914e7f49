"""multigpu-course: teaching primitives for training one network on several GPUs (real or emulated).

The folders follow the course (docs/contributing.md, "Where things are"); a student script imports the top level:
:mod:`~course.world`, :mod:`~course.data`, :mod:`~course.models`, :mod:`~course.train`, :mod:`~course.report`.
"""

__version__ = "0.1.0"
