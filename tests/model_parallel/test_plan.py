"""course.model_parallel.plan: each term of the modelled step is its closed form; the choice fits in memory."""

import pytest

from course.memory.budget import Setup, model_states
from course.model_parallel import plan
from course.perf import catalog as hardware
from course.perf.model import Cluster

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

CLUSTER = Cluster(hardware.gpu("H100 SXM5"), hardware.link("NVLink 4 (H100, 18 links)"), 8,
                  hardware.link("InfiniBand NDR"))
SMALL, MEDIUM, LARGE = plan.GPT


def test_compute_is_six_flops_per_parameter_and_token_shared_by_every_gpu():
    one = plan.estimate(MEDIUM, 1, 1, 1, 64, CLUSTER)
    many = plan.estimate(MEDIUM, 2, 4, 8, 64, CLUSTER)
    peak = CLUSTER.gpu.peak_flops("fp16") * plan.MIXED.compute_efficiency
    assert one.seconds["compute"] == pytest.approx(6 * MEDIUM.params * 64 * MEDIUM.seq_len / peak)
    assert many.seconds["compute"] == pytest.approx(one.seconds["compute"] / 64)


def test_the_bubble_is_p_minus_1_over_m_of_the_busy_time():
    split = plan.estimate(MEDIUM, 2, 4, 2, 64, CLUSTER)  # m = 64 / 2 = 32 micro-batches
    busy = split.seconds["compute"] + split.seconds["tensor parallel"]
    assert split.seconds["bubble"] == pytest.approx(busy * 3 / 32)
    assert split.seconds["bubble"] / (split.seconds["bubble"] + busy) == pytest.approx(3 / (32 + 3))


def test_pure_data_parallelism_has_no_bubble_and_no_activation_all_reduce_and_keeps_every_parameter():
    pure = plan.estimate(SMALL, 1, 1, 64, 512, CLUSTER)
    assert pure.seconds["bubble"] == pure.seconds["tensor parallel"] == 0
    states = model_states(SMALL.params, Setup("adam", "bf16", zero_stage=1, world_size=64)).total
    assert pure.memory_bytes > states


def test_splitting_the_weights_shrinks_the_memory_per_gpu():
    memory = [plan.estimate(LARGE, t, 8, 8 // t, 512, CLUSTER).memory_bytes for t in (1, 2, 4, 8)]
    assert memory == sorted(memory, reverse=True)


def test_the_choice_fits_and_the_largest_model_cannot_be_pure_data_parallel():
    rows = {row["model"]: row for row in plan.table(plan.GPT, 64, 512, CLUSTER)}
    assert rows["GPT 175B"]["pure DP GB/GPU"] > CLUSTER.gpu.memory_bytes / 1e9
    for model in plan.GPT:
        best = plan.choose(model, 64, 512, CLUSTER)
        assert best is not None and best.fits and best.tp * best.pp * best.dp == 64
        assert all(best.step_s <= other.step_s for other in plan.plans(model, 64, 512, CLUSTER) if other.fits)
    assert plan.choose(LARGE, 8, 512, CLUSTER) is None  # 175B parameters do not fit on one node
