"""course.experts.expert_parallel on 2 and 4 gloo ranks: outputs and every gradient equal the one-process layer
run on each rank's tokens, with and without dropped tokens; counts first, then dispatch and combine."""

import pytest

from course.experts import expert_parallel as ep
from course.experts import moe
from course.runtime.launch import launch


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("world_size", "factor"), [(2, 2.0), (4, 0.5)], ids=["2-no-drops", "4-drops"])
def test_expert_parallel_equals_the_one_process_layer(world_size, factor):
    config = moe.Config(num_experts=4, capacity_factor=factor)
    results = launch(ep.step_on_rank, world_size, config, 16, timeout_s=180)
    assert (sum(r["dropped"] for r in results) > 0) == (factor < 1)
    for result in results:
        for key in ("out_error", "input_grad_error", "router_grad_error", "expert_grad_error"):
            assert result[key] < 1e-5, (key, result)
        names = [name for name, _ in result["calls"]]
        # forward: counts, dispatch, combine; backward: combine's and dispatch's gradients
        assert names == ["all_to_all_single"] * 5
        counts_bytes, dispatch_bytes = result["calls"][0][1], result["calls"][1][1]
        assert counts_bytes == 4 * 8  # E int64 counts
        assert dispatch_bytes % (config.d_model * 4) == 0


def test_replica_groups_for_ep_times_dp():
    groups = ep.replica_groups(8, 4)
    assert groups["expert_parallel"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups["expert_data_parallel"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="must divide world_size"):
        ep.replica_groups(6, 4)
