"""course.ring_lesson: the ring allreduce of notebook 04, held to dist.all_reduce."""

import inspect

import pytest
import rank_functions as rf

from course import ring_lesson
from course.launch import launch

pytestmark = [pytest.mark.unit4, pytest.mark.slow]
SIZES = [1, 2, 3, 5, 17, 1000, 4099]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_teaching_ring_sums_like_dist_all_reduce(world_size):
    for worst in launch(rf.teaching_ring_against_all_reduce, world_size, SIZES, timeout_s=120):
        assert max(worst) < 1e-12, worst


def test_the_lesson_fits_on_a_slide():
    assert len(inspect.getsource(ring_lesson.ring_allreduce).splitlines()) <= 16
