"""course.collectives.ring_lesson: the ring allreduce of notebook 04, held to dist.all_reduce."""

import inspect

import pytest

from course.collectives import ring_lesson
from course.runtime.launch import launch

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_teaching_ring_sums_like_dist_all_reduce(world_size):
    sizes = (1, 2, 3, 5, 17, 1000, 4099)  # fewer elements than ranks too: empty chunks
    assert max(launch(ring_lesson.largest_difference, world_size, sizes, timeout_s=120)) < 1e-12


def test_the_lesson_fits_on_a_slide():
    assert len(inspect.getsource(ring_lesson.ring_allreduce).splitlines()) <= 16
