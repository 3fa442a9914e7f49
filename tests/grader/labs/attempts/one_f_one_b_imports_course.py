"""Wrong attempt (one_f_one_b): the course's own schedule, imported instead of written."""

from course.model_parallel.schedules import one_f_one_b as course_one_f_one_b


def one_f_one_b(num_stages: int, num_micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The order in which `stage` runs the forwards ("F", i) and backwards ("B", i) of micro-batches 0..m-1."""
    return [(op.kind, op.micro_batch) for op in course_one_f_one_b(num_stages, num_micro_batches, stage)]
