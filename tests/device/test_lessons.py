"""Every lesson's rank function keeps its tensors on the rank's device (see ``declared_device``)."""

import pytest
from declared_device import device_errors, run_ranks

from course.model_parallel import mesh, pipeline, sequence_parallel, tensor_parallel, transformer

pytestmark = pytest.mark.unit8

SMALL = transformer.Config(num_layers=2, seq_len=8, d_model=16, num_heads=4, d_ff=32)
DEEP = transformer.Config(num_layers=4, seq_len=8, d_model=16, num_heads=4, d_ff=32)

NOTEBOOK_08 = {
    "tensor parallel": (tensor_parallel.step_on_rank, 4, (SMALL, 4)),
    "sequence parallel": (sequence_parallel.step_on_rank, 4, (SMALL, 4)),
    "pipeline, gpipe": (pipeline.step_on_rank, 4, (DEEP, "gpipe", 4, 4)),
    "pipeline, 1f1b": (pipeline.step_on_rank, 4, (DEEP, "1f1b", 4, 4)),
    "mesh": (mesh.step_on_rank, 4, (SMALL, 2, 4)),
}


@pytest.mark.parametrize("lesson", NOTEBOOK_08)
def test_notebook_08_lessons_stay_on_the_rank_device(lesson):
    fn, world_size, args = NOTEBOOK_08[lesson]
    outcomes = run_ranks(fn, world_size, *args)
    assert not device_errors(outcomes), "\n".join(device_errors(outcomes))
    assert [o.stopped for o in outcomes] == [""] * world_size  # every rank ran to its end


def _other_lessons() -> dict:
    """The other notebooks' rank functions, with small arguments (as the notebooks launch them)."""
    import torch.distributed as dist

    from course import hello
    from course.collectives import timing_ranks
    from course.ddp import calibration, horovod, internals, overlap
    from course.ddp import distributed_optimizer as do
    from course.memory import sharding
    from course.model_parallel import two_stage
    from course.practice import compiled_ddp, evaluation, pitfalls
    from course.practice import mixed_precision as mp

    return {
        "00 hello": (hello.hello, 4, ()),
        "03 two-stage pipeline": (two_stage.run_pipeline, 2, (two_stage.Config(),
                                                               two_stage.training_batch(two_stage.Config()))),
        "04 allreduce timing": (timing_ranks.measure, 4, ([1024], 2, 1003)),
        "05b time_allreduce": (timing_ranks.time_allreduce, 4, ([1024], {"gloo": dist.all_reduce}, 2)),
        "04b misuse": (do.misuse_message, 1, ()),
        "04b horovod": (horovod.recipe, 4, ()),
        "04b compare": (internals.compare_many, 4, ([{"optimizer": "sgd", "bucket_bytes": 16 * 1024}],)),
        "04b overlap": (overlap.record_steps, 4, ([16 * 1024],)),
        "05 ddp internals": (internals.internals, 2, ()),
        "05 calibration": (calibration.measure, 4, ((1, 2), (16,), (), 1, 2)),
        "07 sharding": (sharding.both, 4, ("adam", 2)),
        "09 mixed precision": (mp.train_each, 2, (("fp32",),)),
        "09 evaluation": (evaluation.evaluate, 2, ()),
        "09b pitfalls": (pitfalls.all_contrasts, 2, ()),
        "09b compiled DDP": (compiled_ddp.compile_contrast, 2, ()),
    }


OTHER_LESSONS = [
    "00 hello", "03 two-stage pipeline", "04 allreduce timing", "05b time_allreduce", "04b misuse", "04b horovod",
    "04b compare", "04b overlap", "05 ddp internals", "05 calibration", "07 sharding", "09 mixed precision",
    "09 evaluation", "09b pitfalls", "09b compiled DDP",
]


@pytest.mark.parametrize("lesson", OTHER_LESSONS)
def test_the_other_lessons_put_nothing_they_communicate_on_the_cpu(lesson):
    """Values read on ``meta`` are ones, so some of these stop early (a check of a sum, an FSDP mesh on meta): only
    what ran before is checked, and ``outcome.stopped`` says where."""
    fn, world_size, args = _other_lessons()[lesson]
    outcomes = run_ranks(fn, world_size, *args)
    assert not device_errors(outcomes), "\n".join(device_errors(outcomes))
