"""The all-gather and reduce-scatter under the installed torch's name: the new one where it exists, no warning."""

import warnings

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from course.runtime import collective_names
from course.runtime.collective_names import all_gather_single, named, reduce_scatter_single


@pytest.fixture
def group():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


def test_the_new_names_are_picked_where_torch_has_them():
    assert [named(new) for new in collective_names.OLDER] == ["all_gather_single", "reduce_scatter_single"]


def test_older_torch_gets_the_older_names(monkeypatch):
    calls = []
    for new, old in collective_names.OLDER.items():
        monkeypatch.delattr(dist, new)
        monkeypatch.setattr(dist, old, lambda *args, _old=old, **kwargs: calls.append((_old, kwargs)))
    all_gather_single(torch.empty(4), torch.empty(2), group=None)
    reduce_scatter_single(torch.empty(2), torch.empty(4), async_op=True)
    assert calls == [("all_gather_into_tensor", {"group": None}), ("reduce_scatter_tensor", {"async_op": True})]


def test_calls_on_the_installed_torch_warn_of_nothing(group):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        all_gather_single(torch.empty(4), torch.ones(2))
        reduce_scatter_single(torch.empty(2), torch.ones(4))


def test_an_unknown_name_is_refused():
    with pytest.raises(ValueError, match="all_gather_single"):
        named("all_gather_tensor")


def test_the_table_knows_every_collective_and_message_method_of_the_process_group():
    methods = {name for name in dir(dist.ProcessGroup) if not name.startswith("__")}
    assert set(collective_names.METHODS) <= methods
    assert {"allreduce", "all_gather_single", "send", "recv", "barrier", "alltoall_base"} <= set(
        collective_names.METHODS)


def test_old_and_new_names_do_the_same_operation_and_count_the_same_bytes():
    assert collective_names.of("all_gather_into_tensor") == collective_names.of("all_gather_single")
    assert collective_names.of("reduce_scatter_tensor") == collective_names.of("reduce_scatter_single")
    assert set(collective_names.functions("all_gather")) >= {"all_gather", "all_gather_object", "_all_gather_base"}
    assert collective_names.of("broadcast").combines is False and collective_names.of("allgather").combines
    # a ring: 2(n-1)/n of the tensor for an all-reduce; (n-1) pieces for an all-gather of one piece
    assert collective_names.sent_bytes("all_reduce", 400, 4) == 600
    assert collective_names.sent_bytes("all_gather", 100, 4) == 300
    assert collective_names.sent_bytes("reduce_scatter", 400, 4) == 300
    with pytest.raises(KeyError, match="all_gather_single"):
        collective_names.of("all_gather_tensor")
