"""course.runtime.recorder: the labs' record of a rank's calls is the observation layer's, so every route to a
collective gives the same record; the checker's own calls are not in it; each wait is timed. On a world of one rank
in this process (the 2-rank routes, with results landing at ``wait()``: tests/grader/labs/test_late_results.py)."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional
from torch.distributed import all_gather_into_tensor  # imported by name before any recorder opened

from course.runtime import observed, recorder


@pytest.fixture
def alone():
    """A world of one observed rank in this process; torch's own gloo again after."""
    with observed.installed():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _gathers() -> dict[str, object]:
    """Each route to an all-gather of 3 floats on a world of one."""
    from torch.distributed.device_mesh import init_device_mesh
    mine, mesh = torch.ones(3), init_device_mesh("cpu", (1,)).get_group()
    return {
        "all_gather_single": lambda: dist.all_gather_single(torch.empty(3), mine),
        "imported all_gather_into_tensor": lambda: all_gather_into_tensor(torch.empty(3), mine),
        "list all_gather": lambda: dist.all_gather([torch.empty(3)], mine),
        "functional": lambda: functional.all_gather_tensor(mine, 0, dist.group.WORLD).wait(),
        "mesh": lambda: dist.all_gather_single(torch.empty(3), mine, group=mesh),
    }


def test_every_route_to_an_all_gather_gives_one_record_of_the_same_effect(alone):
    seen = {}
    for name, call in _gathers().items():
        with recorder.recording(1) as record:
            call()
        seen[name] = [(r.op, r.kind, r.nbytes, r.sent_bytes, r.waited is not None) for r in record.calls]
    assert seen == dict.fromkeys(seen, [("all_gather", "collective", 12, 0.0, True)])


def test_the_checkers_original_calls_are_not_recorded(alone):
    with recorder.recording(1) as record:
        recorder.ORIGINAL["all_reduce"](torch.ones(2))
        dist.all_reduce(torch.ones(2))
    assert [(r.op, r.api) for r in record.calls] == [("all_reduce", "all_reduce")]


def test_a_wait_is_timed_when_the_code_first_waits_for_the_work_or_its_future(alone):
    with recorder.recording(1) as record:
        work = dist.all_reduce(torch.ones(2), async_op=True)
        future = dist.all_reduce(torch.ones(2), async_op=True).get_future()
        dist.all_reduce(torch.ones(2))
        unwaited = [r.waited for r in record.calls[:2]]
        work.wait()
        assert record.calls[1].waited is None  # taking the future is not waiting for it
        assert torch.equal(future.wait()[0], torch.ones(2))
    assert unwaited == [None, None]
    assert [(r.async_op, r.waited is not None) for r in record.calls] == [(True, True), (True, True), (False, True)]
    assert record.calls[0].waited <= record.calls[1].waited


def test_a_forbidden_class_built_is_noted(alone):
    with recorder.recording(1, forbidden=(torch.nn.parallel.DistributedDataParallel,)) as record:
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    assert record.constructed == ["DistributedDataParallel"]


def test_on_torchs_own_group_the_recorder_hears_the_functions_by_name():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with recorder.recording(1) as record:
            dist.all_reduce(torch.ones(2))
            dist.all_gather_single(torch.empty(2), torch.ones(2), async_op=True).wait()
    finally:
        dist.destroy_process_group()
    assert not isinstance(dist.group.WORLD, observed.ObservedGroup)
    assert [(r.op, r.api, r.nbytes, r.async_op, r.waited is not None) for r in record.calls] == [
        ("all_reduce", "all_reduce", 8, False, True), ("all_gather", "all_gather_single", 8, True, True)]
