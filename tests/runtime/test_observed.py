"""course.runtime.observed: every route to a collective or a message gives the same record, noted by the process
group itself, so no import order or alias can hide a call; and the group still says it is gloo."""

import observed_ranks
import pytest
import torch
import torch.distributed as dist

from course.runtime import observed
from course.runtime.launch import launch


@pytest.fixture(scope="module")
def routes():
    return launch(observed_ranks.routes, 2, timeout_s=120)


def _effect(records):
    """What a route must agree on: (op, kind, bytes, peer), without the name the code called."""
    return [(op, kind, nbytes, peer) for op, kind, _api, nbytes, peer in records]


def test_launch_ranks_run_on_an_observed_group_that_still_says_gloo(routes):
    assert [(r["observed"], r["backend"]) for r in routes] == [(True, "gloo")] * 2


@pytest.mark.parametrize("route", ["all_gather_into_tensor", "functional", "mesh"])
def test_every_all_gather_route_gives_the_record_of_all_gather_single(routes, route):
    for found in routes:
        assert _effect(found[route]) == _effect(found["all_gather_single"]) == [("all_gather", "collective", 16, None)]


def test_old_and_new_reduce_scatter_names_give_one_record_and_keep_the_name_called(routes):
    assert _effect(routes[0]["reduce_scatter_tensor"]) == _effect(routes[0]["reduce_scatter_single"])
    assert [r[2] for r in routes[0]["reduce_scatter_tensor"] + routes[0]["reduce_scatter_single"]] == [
        "reduce_scatter_tensor", "reduce_scatter_single"]


@pytest.mark.parametrize("route", ["batch", "protocol"])
def test_every_message_route_gives_the_record_of_isend_imported_by_name(routes, route):
    for rank, found in enumerate(routes):
        other = 1 - rank
        assert _effect(found["by_name"]) == [("send", "p2p", 16, other), ("recv", "p2p", 16, other)]
        assert _effect(found[route]) == _effect(found["by_name"])
    assert [r[2] for r in routes[0]["by_name"]] == ["isend", "irecv"]
    assert [r[2] for r in routes[0]["protocol"]] == ["ProcessGroup.send", "ProcessGroup.recv"]


def test_a_new_group_is_observed_too(routes):
    assert _effect(routes[1]["new_group"]) == _effect(routes[1]["all_reduce"]) == [
        ("all_reduce", "collective", 16, None)]


@pytest.fixture
def alone():
    """A world of one rank in this process, made by the test; torch's own gloo again after."""
    yield dist.HashStore()
    if dist.is_initialized():
        dist.destroy_process_group()
    observed.uninstall()


@pytest.mark.parametrize("backend", ["gloo", None])
def test_inside_installed_a_gloo_world_is_observed_however_it_is_named(alone, backend):
    with observed.installed():
        dist.init_process_group(backend, store=alone, rank=0, world_size=1)
    records = []
    with observed.listening(records.append):
        dist.all_reduce(torch.ones(3))
    assert observed.is_observed() and "gloo" in str(dist.get_backend_config())  # "undefined" for None, as torch says
    assert [(r.op, r.api, r.nbytes, r.where.rsplit(":", 1)[0]) for r in records] == [
        ("all_reduce", "all_reduce", 12, __file__)]


def test_the_observed_backend_by_name(alone):
    observed.register()
    dist.init_process_group("observed", store=alone, rank=0, world_size=1)
    records = []
    with observed.listening(records.append):
        dist.all_reduce(torch.ones(3))
    assert observed.is_observed() and str(dist.get_backend()) == "observed"
    assert [(r.op, r.api, r.nbytes) for r in records] == [("all_reduce", "all_reduce", 12)]


def test_outside_installed_gloo_is_torchs_own(alone):
    dist.init_process_group("gloo", store=alone, rank=0, world_size=1)
    assert not observed.is_observed()


def test_ddp_reducer_calls_are_recorded_as_torchs(alone):
    with observed.installed():
        dist.init_process_group("gloo", store=alone, rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    records = []
    with observed.listening(records.append):
        model(torch.ones(5, 3)).sum().backward()
    assert [(r.op, r.api, r.by_torch, r.nbytes) for r in records] == [
        ("all_reduce", "ProcessGroup.allreduce", True, 8 * 4)]
