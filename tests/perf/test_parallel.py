"""course.perf.parallel: tensor x pipeline x data parallelism and sharded data parallelism, in closed form."""

from dataclasses import replace

import pytest

from course.perf import catalog, parallel
from course.perf.comm import Cluster

pytestmark = pytest.mark.unit5

SELENE = Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                 catalog.link("InfiniBand HDR"), 8)
GPT = parallel.Transformer("GPT 39B", 48, 8192, 64)


def test_parameters_and_flops_follow_the_papers_formulas():
    assert parallel.Transformer("1T", 128, 25600, 160).params == pytest.approx(1008.0e9, rel=0.005)  # Table 1
    s, h, layers, v = 2048, 8192, 48, 51200
    assert GPT.megatron_flops(1) == pytest.approx(96 * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h)))
    assert GPT.megatron_flops(1, recompute=False) == pytest.approx(0.75 * GPT.megatron_flops(1))


def test_tensor_parallel_traffic_is_zero_without_tensor_parallelism():
    one = parallel.step_time(GPT, parallel.Plan(1, 8, 1, 64), SELENE)
    assert one.tensor_comm_s == 0
    assert parallel.step_time(GPT, parallel.Plan(8, 8, 1, 64), SELENE).tensor_comm_s > 0


def test_the_bubble_is_p_minus_1_microbatch_times_and_interleaving_divides_it():
    plan = parallel.Plan(8, 4, 1, 32)
    step = parallel.step_time(GPT, plan, SELENE)
    micro = step.pipeline_s / (plan.microbatches + plan.pipeline - 1)
    assert step.bubble_s == pytest.approx((plan.pipeline - 1) * micro)
    interleaved = parallel.step_time(GPT, replace(plan, interleave=2), SELENE)
    assert interleaved.bubble_s == pytest.approx(step.bubble_s / 2)


def test_sharding_trades_memory_for_communication_and_optimizer_time():
    ddp = parallel.step_time(GPT, parallel.Plan(8, 2, 4, 64), SELENE)
    zero = parallel.step_time(GPT, parallel.Plan(8, 2, 4, 64, sharding="zero2"), SELENE)
    fsdp = parallel.step_time(GPT, parallel.Plan(8, 2, 4, 64, sharding="fsdp"), SELENE)
    assert zero.data_comm_s == pytest.approx(ddp.data_comm_s) and zero.update_s < ddp.update_s
    assert fsdp.data_comm_s >= zero.data_comm_s


def test_plans_the_model_cannot_run_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="inside a node"):
        parallel.step_time(GPT, parallel.Plan(16, 1, 1, 64), SELENE)
    with pytest.raises(ValueError, match="divides the layers"):
        parallel.step_time(GPT, parallel.Plan(8, 5, 1, 64), SELENE)
    with pytest.raises(ValueError, match="sharding"):
        parallel.step_time(GPT, parallel.Plan(8, 1, 1, 64, sharding="zero4"), SELENE)
