"""Wrong: it imports the course's own GatherLinear."""

from course.model_parallel.sequence_parallel import GatherLinear  # noqa: F401
