"""Model parallelism (notebook 03, and the tensor/pipeline unit): two_stage (a network cut into stages, one per
rank) and bubble (the idle time of a pipeline)."""

from typing import Any


def __getattr__(name: str) -> Any:
    """What the old ``course/model_parallel.py`` defined, now in :mod:`course.model_parallel.two_stage`."""
    from course import _moved

    return _moved.forward("model_parallel", name)
