"""course.perf.planner: memory per GPU from course.memory.budget, and the fastest strategy that fits."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.memory import budget as memory_budget
from course.perf import catalog, parallel, planner
from course.perf.comm import Cluster

pytestmark = pytest.mark.unit5

NODE = Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
               catalog.link("InfiniBand HDR"), 8)
GPT30 = parallel.Transformer("GPT 30B", 48, 7168, 56)


def test_model_states_are_the_memory_budgets():
    plan = parallel.Plan(1, 1, 8, 256, sharding="fsdp")
    _, states = planner.memory_per_gpu(GPT30, plan, 3)
    expected = memory_budget.model_states(GPT30.params, memory_budget.Setup("adam", "bf16", 3, 8)).model_states
    assert states == pytest.approx(expected) == pytest.approx(16 * GPT30.params / 8)


def test_more_sharding_never_needs_more_memory_and_the_best_option_fits():
    found = {o.strategy: o for o in planner.options(GPT30, NODE, 8, 256)}
    assert found["DDP"].memory_bytes > found["ZeRO-2"].memory_bytes > found["FSDP"].memory_bytes
    assert not found["DDP"].fits  # 16 bytes per parameter replicated: far beyond 80 GB
    best = planner.best(list(found.values()))
    assert best.fits and all(best.step_s <= o.step_s for o in found.values() if o.fits)


def test_a_partial_node_is_refused():
    with pytest.raises(ValueError, match="whole number"):
        planner.options(GPT30, NODE, 12, 256)


def test_interleaving_is_chosen_where_it_pays_and_only_there():
    gpt = parallel.Transformer("GPT 39B", 48, 8192, 64)
    deep = parallel.Plan(8, 8, 1, 64)
    chosen = planner.interleaved(gpt, deep, NODE)
    steps = {v: parallel.step_time(gpt, parallel.Plan(8, 8, 1, 64, interleave=v), NODE).step_s for v in (1, 2, 3, 6)}
    assert chosen.interleave == min(steps, key=steps.get) > 1
    assert planner.interleaved(gpt, parallel.Plan(8, 1, 1, 64), NODE).interleave == 1  # no pipeline, no bubble
    odd = parallel.Plan(8, 8, 1, 12)  # 12 microbatches do not come in groups of 8 stages
    assert planner.interleaved(gpt, odd, NODE).interleave == 1


def test_a_fused_attention_kernel_holds_no_attention_scores():
    plan = parallel.Plan(1, 1, 8, 256, sharding="fsdp", fused_attention=False)
    unfused, _ = planner.memory_per_gpu(GPT30, plan, 3)
    fused, _ = planner.memory_per_gpu(GPT30, replace(plan, fused_attention=True), 3)
    s, h, a = GPT30.seq, GPT30.hidden, GPT30.heads
    assert unfused - fused == pytest.approx(s * h * 5 * a * s / h)  # Korthikanti et al.'s 5·a·s² bytes, b = t = 1


MIXTRAL = parallel.Transformer("Mixtral 8x7B", 32, 4096, 32, 4096, 32000, 0, True, 8, False, False, experts=8,
                               top_k=2, expert_ffn=14336)


@settings(max_examples=25, deadline=None)
@given(c=st.sampled_from([1, 2, 4, 8, 16]), t=st.sampled_from([1, 2, 8]), fused=st.booleans())
def test_context_parallelism_divides_every_activation_by_its_degree(c, t, fused):
    long = replace(GPT30, seq=32768)
    plan = parallel.Plan(t, 1, 16, 64, sharding="zero1", fused_attention=fused)
    whole, states = planner.memory_per_gpu(long, plan, 1)
    split, split_states = planner.memory_per_gpu(long, replace(plan, context=c), 1)
    assert split - split_states == pytest.approx((whole - states) / c)
    # Adam's state is sharded over the d·c GPUs that hold the same weights
    expected = memory_budget.model_states(long.params / t, memory_budget.Setup("adam", "bf16", 1, 16 * c))
    assert split_states == pytest.approx(expected.model_states)


@settings(max_examples=20, deadline=None)
@given(e=st.sampled_from([1, 2, 4, 8]), t=st.sampled_from([1, 2]))
def test_expert_parallelism_divides_the_experts_weights_by_its_degree(e, t):
    plan = parallel.Plan(t, 1, 8, 64, expert=e)
    _, states = planner.memory_per_gpu(MIXTRAL, plan, 0)  # no ZeRO: 16 bytes per parameter held
    dense = MIXTRAL.params - MIXTRAL.expert_params
    assert states == pytest.approx(16 * (dense + MIXTRAL.expert_params / e) / t)
