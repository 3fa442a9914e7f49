"""course.collectives.shm_allreduce against dist.all_reduce on world sizes 1-4, many sizes and dtypes (one 4-rank
launch)."""

import pytest
import shm_ranks
import torch

from course.collectives.shm_allreduce import shm_allreduce
from course.runtime.launch import launch

pytestmark = pytest.mark.unit5

WORLD_SIZE = 4
BAD_RANK = 2
MAX_EXAMPLES = 80


@pytest.fixture(scope="module")
def report():
    return launch(shm_ranks.everything, WORLD_SIZE, MAX_EXAMPLES, BAD_RANK, timeout_s=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hypothesis_cases_match_dist_all_reduce(report):
    cases = report[0]["hypothesis"]
    assert cases["failures"] == []
    assert cases["count"] >= MAX_EXAMPLES // 2
    assert {k for k, _ in cases["covered"]} == set(range(1, WORLD_SIZE + 1))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("what", ["numel", "shape", "dtype", "op"])
def test_a_rank_that_disagrees_is_named_on_every_rank_and_the_group_stays_usable(report, what):
    for rank in report:
        message = rank["mismatches"][what]
        assert f"rank {BAD_RANK} has" in message, message
        assert "same tensor shape, dtype and op (and the same call) on every rank" in message
        assert rank["mismatches"][f"{what}, next call right"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tensors_that_outgrow_the_mapping_are_summed_exactly(report):
    assert all(all(rank["growing"]) for rank in report)
    assert len(report[0]["growing"]) == 5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_late_rank_is_waited_for_sleeping_on_a_futex_or_polling(report):
    assert all(rank["late_rank"] == {"futex": True, "polling": True} for rank in report)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_on_different_hosts_are_refused_on_every_rank(report):
    for rank in report:
        assert "needs every rank of the group on one host" in rank["different_hosts"]
        assert "['host0', 'host1']" in rank["different_hosts"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_file_is_left_in_dev_shm(report):
    assert all(rank["files"] == [] for rank in report)


def test_a_world_of_one_is_a_no_op():
    tensor = torch.arange(5.0)
    assert shm_allreduce(tensor, op="avg") is tensor
    assert torch.equal(tensor, torch.arange(5.0))


@pytest.mark.parametrize(("tensor", "message"), [
    (torch.ones(3, dtype=torch.int64), "supports dtypes"),
    (torch.ones(4, 4).t(), "contiguous"),
    ([1.0, 2.0], "needs a torch.Tensor"),
])
def test_bad_input_says_what_and_how_to_fix_it(tensor, message):
    with pytest.raises((ValueError, TypeError), match=message):
        shm_allreduce(tensor)


def test_a_bad_op_names_the_allowed_ones():
    with pytest.raises(ValueError, match="op must be one of"):
        shm_allreduce(torch.ones(3), op="max")
