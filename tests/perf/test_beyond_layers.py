"""course.perf.beyond_layers: the pipeline's ends, gradient clipping and the price of TP overlap, in closed form."""

from dataclasses import replace

import pytest

from course.perf import beyond_layers, catalog, microbench, parallel
from course.perf.comm import Cluster
from course.perf.sharding import ALL_TERMS

pytestmark = pytest.mark.unit5

H100 = Cluster(catalog.gpu("H100 SXM5"), catalog.link("NVSwitch (H100, NVLink 4)"), 8,
               catalog.link("InfiniBand NDR"), 8)
GPT3 = parallel.Transformer("GPT-3 175B", 96, 12288, 96, 4096, 131072)
PLAN = parallel.Plan(4, 8, 16, 1152, 1, "zero1", interleave=3, recompute="selective", precision="bf16",
                     tp_overlap=True)


def test_the_loss_moves_sixty_bytes_per_logit_at_the_memory_rate():
    rate = H100.gpu.memory_bandwidth * microbench.constant("memory")
    assert beyond_layers.loss_seconds(GPT3, 4096, 4, H100) == pytest.approx(4096 * 131072 / 4 * 60 / rate)


def test_tied_embeddings_are_all_reduced_only_across_a_pipeline():
    assert beyond_layers.tied_embedding_seconds(GPT3, 4, 1, "bf16", H100) == 0.0
    untied = replace(GPT3, tied=False)
    assert beyond_layers.tied_embedding_seconds(untied, 4, 8, "bf16", H100) == 0.0
    fp32, fp16 = (beyond_layers.tied_embedding_seconds(GPT3, 4, 8, p, H100) for p in ("bf16", "fp16"))
    assert fp32 > fp16 > 0  # Megatron accumulates bf16 runs' gradients in FP32


def test_overlapped_tp_costs_its_last_chunk_and_the_sms_it_takes():
    cost = beyond_layers.tp_overlap_cost(1.0, "H100 SXM5")
    share = 16 / 132
    assert cost["forward"] == pytest.approx(0.5 / 4 + share * 0.5 * 0.75)
    assert cost["backward"] == pytest.approx(share)
    with pytest.raises(KeyError, match="SM count"):
        beyond_layers.streaming_multiprocessors("K40")


@pytest.mark.parametrize("term", ["pipeline_ends", "grad_clipping", "tp_overlap_partial"])
def test_each_term_only_adds_time_and_switches_off(term):
    on = parallel.step_time(GPT3, PLAN, H100)
    off = parallel.step_time(GPT3, PLAN, H100, replace(ALL_TERMS, **{term: False}))
    assert on.step_s > off.step_s


def test_tp_overlap_partial_does_nothing_without_tp_overlap():
    plain = replace(PLAN, tp_overlap=False)
    on = parallel.step_time(GPT3, plain, H100)
    off = parallel.step_time(GPT3, plain, H100, replace(ALL_TERMS, tp_overlap_partial=False))
    assert on.step_s == off.step_s
