"""course.perf.sharding: the data-parallel collectives as NCCL prices them, FP32 gradients, one reduction per step
where the gradients are accumulated; each against its closed form."""

import math
from dataclasses import replace

import pytest

from course.perf import catalog, microbench, parallel, sharding
from course.perf.comm import Cluster, alpha_beta

pytestmark = pytest.mark.unit5

SELENE = Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                 catalog.link("InfiniBand HDR"), 8)
GPT = parallel.Transformer("GPT 39B", 48, 8192, 64)
INSIDE, BETWEEN = alpha_beta(SELENE.intra), SELENE.network_per_gpu()


def test_nccl_ring_latency_is_every_gpu_of_the_group_as_tuning_cc_counts_it():
    # TP 2 leaves 4 GPUs of each node in a data-parallel group; 16 nodes: n = 64
    plan = parallel.Plan(2, 1, 64, 512)
    n, nodes, per_node = 64, 16, 4
    ring = 2 * (n - nodes) * INSIDE.alpha_s + 2 * (nodes - 1) * BETWEEN.alpha_s  # (nsteps-nInter)·intra + nInter·inter
    tree = 2 * ((per_node - 1) * INSIDE.alpha_s + math.ceil(math.log2(nodes)) * BETWEEN.alpha_s)
    assert sharding.data_parallel_seconds(0.0, plan, SELENE) == pytest.approx(min(ring, tree))
    two_level = replace(sharding.ALL_TERMS, flat_ring=False)
    assert sharding.data_parallel_seconds(0.0, plan, SELENE, two_level) < ring  # 2(g-1) + 2(nodes-1) steps only


def test_a_large_ring_runs_at_its_slower_link_not_at_the_sum_of_both():
    plan, nbytes = parallel.Plan(2, 1, 64, 512), 4e9
    slower = max(INSIDE.beta_s_per_byte, BETWEEN.beta_s_per_byte / 4)
    ring = 2 * 48 * INSIDE.alpha_s + 2 * 15 * BETWEEN.alpha_s + 2 * 63 / 64 * nbytes * slower
    tree = 2 * (3 * INSIDE.alpha_s + 4 * BETWEEN.alpha_s) + 2 * nbytes * BETWEEN.beta_s_per_byte / 4
    assert sharding.data_parallel_seconds(nbytes, plan, SELENE) == pytest.approx(min(ring, tree))


def test_fp32_gradients_double_the_reduction_bytes_and_leave_the_gathers():
    plan = parallel.Plan(8, 1, 32, 512, sharding="zero1")
    fp32 = replace(plan, fp32_grad_reduce=True)
    reduce16, gather16 = sharding.sharding_seconds(GPT, plan, SELENE)
    reduce32, gather32 = sharding.sharding_seconds(GPT, fp32, SELENE)
    assert gather32 == gather16
    shard = GPT.params / 8  # one replica's shard under TP 8
    assert reduce32 == pytest.approx(sharding.data_parallel_seconds(4 * shard, plan, SELENE) / 2)
    assert reduce16 == pytest.approx(sharding.data_parallel_seconds(2 * shard, plan, SELENE) / 2)
    assert reduce32 > 1.9 * reduce16  # bandwidth-bound at this size
    off = replace(sharding.ALL_TERMS, fp32_grad_reduce=False)
    assert sharding.sharding_seconds(GPT, fp32, SELENE, off) == (reduce16, gather16)


def test_accumulated_gradients_are_reduced_once_per_step():
    plan = parallel.Plan(8, 1, 32, 512, sharding="fsdp")  # 16 micro-batches
    each, gathers = sharding.sharding_seconds(GPT, plan, SELENE)
    once, same_gathers = sharding.sharding_seconds(GPT, replace(plan, accumulate_grads=True), SELENE)
    assert each == pytest.approx(plan.microbatches * once) and same_gathers == gathers


def test_a_part_measured_on_its_own_takes_its_own_gemm_rate():
    assert microbench.matmul_efficiency("bf16", "Ampere", "A100 PCIe 80GB") == pytest.approx(252.9 / 312)
    assert microbench.matmul_efficiency("bf16", "Ampere", "A100 SXM4 80GB") == pytest.approx(271.2 / 312)
    assert microbench.matmul_efficiency("bf16", "Hopper", "H100 PCIe") == microbench.matmul_efficiency(
        "bf16", "Hopper")  # no measurement of its own: its generation's, on its own (lower) peak
    assert catalog.gpu("H100 PCIe").peak_flops("bf16") == 756e12
