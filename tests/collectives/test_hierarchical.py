"""course.collectives.hierarchical against dist.all_reduce: 4 ranks as 1x4, 2x2 and 4x1 nodes, sub-groups of 1-3
ranks."""

import pytest
import shm_ranks
import torch

from course.collectives.hierarchical import hierarchical_allreduce
from course.runtime.launch import launch

pytestmark = pytest.mark.unit5

WORLD_SIZE = 4
BAD_RANK = 2  # a leader when nodes have 2 ranks; BAD_RANK + 1 is not
MAX_EXAMPLES = 80


@pytest.fixture(scope="module")
def report():
    return launch(shm_ranks.hierarchical, WORLD_SIZE, MAX_EXAMPLES, BAD_RANK, timeout_s=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hypothesis_cases_match_dist_all_reduce(report):
    cases = report[0]["hypothesis"]
    assert cases["failures"] == []
    assert cases["count"] >= MAX_EXAMPLES // 2
    assert {(4, 2), (4, 4), (4, 1), (2, 2), (3, 3)} <= cases["covered"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("who", ["leader", "not a leader"])
def test_a_rank_that_disagrees_makes_every_rank_raise_and_the_group_stays_usable(report, who):
    """Ranks that saw the mismatch say what differs; the others hear from their leader that it failed."""
    bad = BAD_RANK if who == "leader" else BAD_RANK + 1
    for rank in report:
        message = rank["mismatches"][who]
        assert "same tensor shape" in message or "a node's leader) failed before its broadcast" in message, message
        assert rank["mismatches"][f"{who}, next call right"]
    assert "same tensor shape" in report[bad]["mismatches"][who]


def test_a_world_of_one_is_a_no_op():
    tensor = torch.arange(5.0)
    assert hierarchical_allreduce(tensor) is tensor
    assert torch.equal(tensor, torch.arange(5.0))


def test_an_unknown_algorithm_across_nodes_is_named():
    with pytest.raises(ValueError, match="across must be one of"):
        hierarchical_allreduce(torch.ones(3), across="butterfly")
