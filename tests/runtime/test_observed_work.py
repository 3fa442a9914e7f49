"""course.runtime.observed_work: a held work handle is a real ``dist.Work``; it tells who waits, lands results
before the code can see them, through ``wait()`` or the future, and hands on a call's failure."""

import pytest
import torch
import torch.distributed as dist

from course.runtime.observed_work import HeldWork


@pytest.fixture
def alone():
    """A world of one rank on torch's own gloo in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _held(events):
    private, target = torch.full((2,), 5.0), torch.zeros(2)
    work = dist.all_reduce(private, async_op=True)
    held = HeldWork(work, on_wait=lambda: events.append("wait"),
                    on_done=lambda: (events.append("done"), target.copy_(private)), swap={id(private): target})
    return held, target


def test_wait_tells_who_waits_then_lands_the_result_once(alone):
    events = []
    held, target = _held(events)
    assert isinstance(held, dist.Work) and events == [] and target.tolist() == [0.0, 0.0]
    held.wait()
    held.wait()
    assert events == ["wait", "done"] and target.tolist() == [5.0, 5.0] and held.is_completed()


def test_the_future_holds_the_landed_target_and_waiting_on_it_counts(alone):
    events = []
    held, target = _held(events)
    future = held.get_future()
    assert "wait" not in events  # taking the future is not waiting for it
    value = future.wait()
    assert events == ["done", "wait"] or events == ["wait", "done"]
    assert value[0] is target and target.tolist() == [5.0, 5.0]


def test_a_failed_call_fails_its_future():
    failed = torch.futures.Future()
    failed.set_exception(RuntimeError("the peer is gone"))

    class Failed(dist.Work):
        def get_future(self):
            return failed

    with pytest.raises(RuntimeError, match="the peer is gone"):
        HeldWork(Failed()).get_future().wait()
