"""The 4-rank lessons at the world size ``course.world.plan`` picks on a machine with 0, 1, 2, 3, 4 or 8 GPUs: the
plan gives one GPU per rank on nccl or emulates 4 ranks on gloo, and on GPUs every rank gets the plan's device and
keeps what it communicates there (``declared_device``, GPUs declared as ``meta``)."""

import pytest
import test_lessons
from declared_device import device_errors, run_ranks

from course import world

pytestmark = pytest.mark.unit0

#: lesson -> (the world sizes it runs at, as its notebook plans it; its arguments at world size n)
SIZES = {
    "tensor parallel": ((2, 4), None), "sequence parallel": ((2, 4), None), "pipeline, gpipe": ((4,), None),
    "pipeline, 1f1b": ((4,), None), "mesh": ((4,), None), "00 hello": (None, None),
    "04 allreduce timing": (None, None), "04b horovod": (None, None), "04b compare": (None, None),
    "04b overlap": (None, None), "07 sharding": ((2, 4), None),
    # notebook 05 still launches 4 ranks; its calibration runs at 2 or 3 when its rank counts fit
    "05 calibration": (None, lambda n: (tuple(k for k in (1, 2, 4) if k <= n), (16,), (), 1, 2)),
}


def _lesson(name: str) -> tuple:
    lessons = {**test_lessons.NOTEBOOK_08, **test_lessons._other_lessons()}
    return lessons[name]


def _declared(gpus: int) -> world.Hardware:
    return world.Hardware(gpu_names=("declared meta device",) * gpus, cpu_count=1, device_type="meta")


def _where(fn):
    """``fn``, also returning the device and world size the rank found itself on."""
    def rank(*args):
        here = world.current()
        fn(*args)
        return str(here.device), here.world_size
    return rank


@pytest.mark.parametrize("gpus", [0, 1, 4])
@pytest.mark.parametrize("lesson", SIZES)
def test_without_two_gpus_or_with_four_a_lesson_keeps_its_four_ranks(lesson, gpus):
    chosen = world.plan(4, SIZES[lesson][0], _declared(gpus))
    assert chosen.world_size == 4 and chosen.backend == ("nccl" if gpus == 4 else "gloo")


@pytest.mark.parametrize("gpus", [2, 3, 8])
@pytest.mark.parametrize("lesson", SIZES)
def test_on_two_three_or_eight_gpus_the_planned_ranks_stay_on_their_gpu(lesson, gpus):
    sizes, arguments = SIZES[lesson]
    chosen = world.plan(4, sizes, _declared(gpus))
    if not chosen.on_gpus:  # the lesson needs more ranks than there are GPUs: 4 emulated ranks, as on a laptop
        assert sizes == (4,) and gpus < 4 and chosen.world_size == 4
        return
    assert chosen.world_size == min(4, gpus if sizes is None else max(n for n in sizes if n <= gpus))
    fn, _, args = _lesson(lesson)
    outcomes = run_ranks(_where(fn), chosen.world_size, *(arguments(chosen.world_size) if arguments else args),
                         gpus=gpus)
    assert not device_errors(outcomes), "\n".join(device_errors(outcomes))
    ran = [o.result for o in outcomes if o.result is not None]  # meta values stop some ranks early (test_lessons)
    assert all(result == (chosen.devices[0], chosen.world_size) for result in ran)
    assert set(chosen.devices) == {"meta"}
