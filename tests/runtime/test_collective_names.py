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
