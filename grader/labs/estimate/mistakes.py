"""The estimate lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_estimate*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "allreduce_once": Mistake(
        why="a ring allreduce's bytes counted once, not 2(n-1)/n times",
        student_id="solution",
        edits=(
            ("    one_allreduce = 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * nbytes / bytes_per_s\n",
             "    one_allreduce = 2 * (n - 1) * alpha_s + nbytes / bytes_per_s  # counted once\n"),
        ),
    ),
    "forgets_optimizer_state": Mistake(
        why="Adam's optimizer state (12 bytes a parameter) is left out",
        student_id="solution",
        edits=(
            ("    parameters, gradients, optimizer_state = 2 * per_gpu, 2 * per_gpu, 12 * per_gpu\n",
             "    parameters, gradients, optimizer_state = 2 * per_gpu, 2 * per_gpu, 0 * per_gpu  # forgot the optimizer\n"),
        ),
    ),
    "imports_course": Mistake(
        why="imports course.perf, which the lab refuses",
        student_id="solution",
        edits=(
            ("course.perf or course.memory is refused.\n"
             '"""\n',
             "course.perf or course.memory is refused.\n"
             '"""\n'
             "\n"
             "from course.perf.planner import memory_per_gpu  # noqa: F401\n"),
        ),
    ),
}
