"""course.sharding: ZeRO-1 (ZeroRedundancyOptimizer) and FSDP2 (fully_shard) on 4 gloo ranks against DDP, with
the bytes each rank holds measured and compared with the estimate. One launch for every check."""

import pytest

from course import sharding
from course.launch import launch

pytestmark = [pytest.mark.unit7, pytest.mark.slow]

WORLD_SIZE = 4


@pytest.fixture(scope="module")
def results():
    return launch(sharding.both, WORLD_SIZE, "adam", 3, timeout_s=240)


@pytest.mark.parametrize("method", ["zero1", "fsdp"])
def test_same_parameters_as_ddp_after_3_steps(results, method):
    for rank in results:
        assert rank[method]["max_diff"] <= 1e-6  # float32 sums in a different order: a few ulps of 1e-2 weights


def test_zero1_shards_only_the_optimizer_state(results):
    zero1 = [rank["zero1"] for rank in results]
    for rank in zero1:
        assert rank["parameters"] == rank["ideal_parameters"]  # replicated, as in DDP
        assert rank["gradients"] == rank["ideal_gradients"]
        assert rank["optimizer_state"] == rank["owned_optimizer_state"]  # 8 bytes x owned params + step counters
    # the shards add up to one full Adam state: Ψ/N each on average (whole tensors per rank, so uneven)
    total = sum(rank["optimizer_state"] for rank in zero1)
    assert total == pytest.approx(WORLD_SIZE * zero1[0]["ideal_optimizer_state"])


def test_fsdp_shards_parameters_gradients_and_state(results):
    fsdp = [rank["fsdp"] for rank in results]
    for rank in fsdp:
        assert rank["parameters"] == rank["chunk_parameters"]  # this rank's row chunk of every parameter
        assert rank["gradients"] == rank["parameters"]
        assert rank["optimizer_state"] == 2 * rank["parameters"] + 4 * 6  # exp_avg, exp_avg_sq, 6 step counters
        assert rank["parameters"] == pytest.approx(rank["ideal_parameters"], rel=0.05)  # rounding to whole rows
    assert sum(rank["parameters"] for rank in fsdp) == pytest.approx(WORLD_SIZE * fsdp[0]["ideal_parameters"])
