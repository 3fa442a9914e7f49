"""course.perf.parallel: tensor x context x pipeline x data parallelism and sharded data parallelism, each term
against its closed form."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.perf import catalog, context_expert, microbench, parallel
from course.perf.comm import Cluster, allreduce_seconds, alpha_beta, message_seconds

pytestmark = pytest.mark.unit5

SELENE = Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                 catalog.link("InfiniBand HDR"), 8)
GPT = parallel.Transformer("GPT 39B", 48, 8192, 64)
PEAK = 312e12
BANDWIDTH = 2039e9 * microbench.constant("memory")


SUSTAINED = microbench.training_efficiency("Ampere")  # fitted on the fitting set (course.perf.protocol)
OLD = parallel.Terms(False, True, *(False,) * 8, gemm_quantisation=False)  # before issue 44, memory kernels kept


def gemm(flops: float, depth: float) -> float:
    return flops / (PEAK * SUSTAINED * microbench.gemm_efficiency("fp16", "Ampere", depth))


def test_parameters_and_flops_follow_the_papers_formulas():
    assert parallel.Transformer("1T", 128, 25600, 160).params == pytest.approx(1008.0e9, rel=0.005)  # Table 1
    s, h, layers, v = 2048, 8192, 48, 51200
    assert GPT.megatron_flops(1) == pytest.approx(96 * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h)))
    # without recomputation: model FLOPs, 72·B·s·l·h²·(1 + s/6h + V/12lh): the logits are never recomputed
    none = 72 * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert GPT.megatron_flops(1, "none") == pytest.approx(none)
    assert GPT.model_flops(3) == pytest.approx(GPT.hardware_flops(3, "none"))
    # selective recomputation: one more forward of the attention core, 4·s²·h per layer and sequence
    selective = GPT.megatron_flops(2, "none") + 2 * 4 * s**2 * h * layers
    assert GPT.megatron_flops(2, "selective") == pytest.approx(selective)


def test_a_llama_counts_its_gated_mlp_grouped_attention_and_untied_embeddings():
    # Llama 3 8B: 32 layers, h 4096, SwiGLU of 14336, 8 key/value heads, vocabulary 128256: 8.03 B parameters
    llama = parallel.Transformer("Llama 3 8B", 32, 4096, 32, 8192, 128256, 14336, True, 8, False, False)
    assert llama.params == pytest.approx(8.03e9, rel=0.002)
    assert llama.model_flops(1) == pytest.approx(6 * 8192 * (llama.params - 128256 * 4096) + 12 * 8192**2 * 4096 * 32)


def test_gemm_efficiency_falls_with_the_reduction_depth():
    k_half = microbench.depth_half()
    assert microbench.gemm_efficiency("fp16", "Ampere", 128) * 312 == pytest.approx(132.46)  # the published figure
    assert microbench.gemm_efficiency("fp16", "Ampere", k_half) == pytest.approx(
        microbench.matmul_efficiency("fp16", "Ampere") / 2)
    assert microbench.gemm_efficiency("bf16", "Volta", 1e12) == pytest.approx(microbench.constant("matmul.fp32"))


def test_a_layer_is_six_gemms_at_their_depths_and_korthikanti_traffic():
    plan = parallel.Plan(8, 1, 1, 8, 2, fused_attention=False)
    terms = parallel.layer_terms(GPT, plan, SELENE, OLD)
    s, h, a, b, t = 2048, 8192, 64, 2, 8
    tokens = s * b
    shapes = ((3 * h, h), (h, h / t), (4 * h, h), (4 * h, 4 * h / t))  # (output width, reduction depth)
    assert terms.gemm_s == pytest.approx(sum(gemm(2 * tokens * h * width / t, depth) for width, depth in shapes))
    assert terms.attention_s == pytest.approx(gemm(2 * s * b * s * h / t, h / a) + gemm(2 * s * b * s * h / t, s))
    stored = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert terms.memory_s == pytest.approx(2 * stored / BANDWIDTH)
    assert terms.tensor_s == pytest.approx(2 * allreduce_seconds(2.0 * s * b * h, 8, SELENE, "ring"))


def test_fused_attention_removes_exactly_the_s_squared_traffic():
    plan = parallel.Plan(8, 1, 1, 8, fused_attention=False)
    unfused, fused = (parallel.layer_terms(GPT, p, SELENE, OLD) for p in (plan, replace(plan, fused_attention=True)))
    s, h, a, t = 2048, 8192, 64, 8
    assert unfused.memory_s - fused.memory_s == pytest.approx(2 * s * h * 5 * a * s / (h * t) / BANDWIDTH)
    assert fused.attention_memory_s == 0 and fused.attention_s == unfused.attention_s  # the FLOPs stay
    assert parallel.step_time(GPT, replace(plan, fused_attention=True), SELENE).step_s < \
        parallel.step_time(GPT, plan, SELENE).step_s


def test_a_flash_kernel_runs_at_its_published_rate_on_the_unmasked_half():
    # issue 44: no k-depth GEMM penalty on a fused kernel; it skips the masked blocks of causal attention
    plan = parallel.Plan(8, 1, 1, 8)
    flash = parallel.layer_terms(GPT, plan, SELENE)
    s, h, t = 2048, 8192, 8
    rate = PEAK * SUSTAINED * microbench.attention_efficiency("Ampere")
    assert flash.attention_s == pytest.approx(2 * (2 * s * s * h / t / 2) / rate)
    shallow = parallel.layer_terms(GPT, plan, SELENE, replace(parallel.Terms(), flash_rate=False))
    assert shallow.attention_s == pytest.approx(gemm(2 * s * s * h / t, h / 64) + gemm(2 * s * s * h / t, s))


def test_tensor_parallel_traffic_is_zero_without_tensor_parallelism():
    one = parallel.step_time(GPT, parallel.Plan(1, 8, 1, 64), SELENE)
    assert one.tensor_comm_s == 0
    assert parallel.step_time(GPT, parallel.Plan(8, 8, 1, 64), SELENE).tensor_comm_s > 0


def test_tensor_parallel_overlap_exposes_only_what_the_gemms_do_not_hide():
    plan = parallel.Plan(8, 1, 1, 8)
    terms = parallel.layer_terms(GPT, plan, SELENE)
    plain, hidden = parallel.layer_passes(terms, plan), parallel.layer_passes(terms, replace(plan, tp_overlap=True))
    assert plain["tensor"] == pytest.approx(3 * terms.tensor_s)  # forward, backward, recomputed forward
    exposed = 2 * max(0.0, terms.tensor_s - terms.gemm_s) + max(0.0, terms.tensor_s - 2 * terms.gemm_s)
    assert hidden["tensor"] == pytest.approx(exposed)
    assert hidden["forward"] == pytest.approx(terms.compute_s + max(0.0, terms.tensor_s - terms.gemm_s))


def test_recomputation_adds_a_forward_the_attention_core_or_nothing():
    plan = parallel.Plan(8, 1, 1, 8, fused_attention=False)
    terms = parallel.layer_terms(GPT, plan, SELENE)
    full = parallel.layer_passes(terms, plan)
    assert full["recompute"] == pytest.approx(full["forward"])
    assert parallel.layer_passes(terms, replace(plan, recompute="none"))["recompute"] == 0
    selective = parallel.layer_passes(terms, replace(plan, recompute="selective"))
    assert selective["recompute"] == pytest.approx(terms.attention_s + terms.attention_memory_s)
    steps = [parallel.step_time(GPT, replace(plan, recompute=r), SELENE).step_s for r in ("none", "selective", "full")]
    assert steps == sorted(steps)


def test_the_bubble_is_the_other_stages_time_and_interleaving_divides_it():
    assert parallel.pipeline_seconds([1.0, 3.0, 2.0], 10, 1) == pytest.approx((10 * 3.0 + 3.0, 3.0))
    assert parallel.pipeline_seconds([2.0] * 4, 8, 3) == pytest.approx((8 * 2.0 + 3 * 2.0 / 3, 3 * 2.0 / 3))
    plan = parallel.Plan(8, 4, 1, 32)
    step = parallel.step_time(GPT, plan, SELENE)
    interleaved = parallel.step_time(GPT, replace(plan, interleave=2), SELENE)
    assert interleaved.bubble_s == pytest.approx(step.bubble_s / 2, rel=0.01)  # the p2p term grows a little
    assert interleaved.step_s < step.step_s


def test_interleaving_sends_at_every_chunk_boundary():
    # issue 33 item 14: each microbatch crosses v chunk boundaries per GPU, so 2·v messages, not 2
    plan = parallel.Plan(8, 4, 1, 32)
    one = message_seconds(2.0 * 2048 * 8192 / 8, SELENE.network_per_gpu())
    for v in (1, 2, 3):
        step = parallel.step_time(GPT, replace(plan, interleave=v), SELENE)
        assert step.p2p_s == pytest.approx(plan.microbatches * 2 * v * one)


def test_interleaving_needs_microbatches_in_groups_of_the_stages():
    with pytest.raises(ValueError, match="groups of the 4 stages"):
        parallel.step_time(GPT, parallel.Plan(8, 4, 1, 6, interleave=2), SELENE)


def test_uneven_stages_run_at_the_pace_of_the_slowest():
    even = parallel.Plan(8, 4, 1, 32)
    assert parallel.step_time(GPT, replace(even, stage_layers=(12,) * 4), SELENE) == \
        parallel.step_time(GPT, even, SELENE)
    # a large vocabulary makes the last stage's logits cost several layers: fewer layers there pays
    wide_vocab = parallel.Transformer("small, 256k vocabulary", 24, 2048, 16, vocab=256_000)
    plan = parallel.Plan(1, 4, 1, 32)
    balanced = replace(plan, stage_layers=(7, 7, 7, 3))
    assert parallel.step_time(wide_vocab, balanced, SELENE).step_s < parallel.step_time(wide_vocab, plan, SELENE).step_s
    with pytest.raises(ValueError, match="stage_layers"):
        parallel.step_time(GPT, replace(even, stage_layers=(12, 12, 12)), SELENE)


def test_context_parallelism_splits_the_sequence_and_rings_the_keys_and_values():
    plan = parallel.Plan(4, 1, 1, 8, context=2)
    terms = parallel.layer_terms(GPT, plan, SELENE)
    flat = replace(parallel.ALL_TERMS, gemm_quantisation=False)  # half the tokens: half the FLOPs, other tiles
    assert parallel.layer_terms(GPT, plan, SELENE, flat).gemm_s == pytest.approx(
        parallel.layer_terms(GPT, replace(plan, context=1), SELENE, flat).gemm_s / 2)
    s, h, t, c = 2048, 8192, 4, 2
    assert terms.context_s == pytest.approx((c - 1) * message_seconds(4.0 * s / c * h / t, alpha_beta(SELENE.intra)))
    passes = parallel.layer_passes(terms, plan)
    assert passes["context"] == pytest.approx(3 * max(0.0, terms.context_s - terms.attention_s)
                                              + max(0.0, 2 * terms.context_s - 2 * terms.attention_s))
    assert plan.gpus == 8
    with pytest.raises(ValueError, match="context"):
        parallel.step_time(GPT, replace(plan, context=3), SELENE)


def test_sharded_traffic_per_step():
    # issue 33 item 4 (terms of then): FSDP reduce-scatters once, gathers before each microbatch's forward and again
    # for backward
    plan = parallel.Plan(8, 2, 4, 64)
    allreduce = parallel.data_parallel_seconds(2.0 * GPT.params / 16, plan, SELENE, OLD)
    m = plan.microbatches
    assert parallel.sharding_seconds(GPT, plan, SELENE, OLD) == pytest.approx((allreduce, 0.0))
    assert parallel.sharding_seconds(GPT, replace(plan, sharding="zero2"), SELENE, OLD) == pytest.approx(
        (allreduce / 2, allreduce / 2))
    assert parallel.sharding_seconds(GPT, replace(plan, sharding="fsdp"), SELENE, OLD) == pytest.approx(
        (allreduce / 2, 2 * m * allreduce / 2))
    assert parallel.sharding_seconds(GPT, replace(plan, sharding="fsdp", reshard_after_forward=False), SELENE,
                                     OLD) == pytest.approx((allreduce / 2, m * allreduce / 2))
    exposed = parallel.step_time(GPT, replace(plan, sharding="fsdp", dp_overlap=False), SELENE, OLD).data_comm_s
    assert exposed == pytest.approx(allreduce / 2 + m * allreduce)


def test_zero2_and_fsdp_reduce_after_every_microbatch():
    # issue 44: a sharded gradient cannot be accumulated locally: one reduce-scatter per microbatch, not per step
    plan, per_step = parallel.Plan(8, 2, 4, 64), replace(parallel.Terms(), per_microbatch_reduce=False)
    m = plan.microbatches
    for sharding in ("zero2", "fsdp"):
        once = parallel.sharding_seconds(GPT, replace(plan, sharding=sharding), SELENE, per_step)
        each = parallel.sharding_seconds(GPT, replace(plan, sharding=sharding), SELENE)
        assert each[0] == pytest.approx(m * once[0]) and each[1] == pytest.approx(once[1])
    zero1 = replace(plan, sharding="zero1")  # ZeRO-1 keeps whole gradients: one reduction per step still
    assert parallel.sharding_seconds(GPT, zero1, SELENE) == parallel.sharding_seconds(GPT, zero1, SELENE, per_step)


def test_fsdp_pays_a_latency_per_layer_and_a_thousand_gpus_take_the_tree():
    plan = parallel.Plan(8, 2, 4, 64, sharding="fsdp")
    one = parallel.sharding_seconds(GPT, plan, SELENE, replace(parallel.Terms(), nccl_algorithms=False))
    per_layer = parallel.sharding_seconds(GPT, plan, SELENE)
    assert per_layer[0] > one[0] and per_layer[1] > one[1]
    # 128 nodes of 8 with one GPU per replica on each node: the ring's 2(n-1) latency steps lose to the tree's
    wide = parallel.Plan(8, 1, 1024, 1024)
    small = 64 * 2**10
    ring = parallel.data_parallel_seconds(small, wide, SELENE, replace(parallel.Terms(), nccl_algorithms=False))
    assert parallel.data_parallel_seconds(small, wide, SELENE) < ring


def test_data_parallel_overlap_hides_the_reduction_behind_the_last_backward():
    plan = parallel.Plan(8, 1, 4, 4)  # one microbatch per replica: backward hides the allreduce
    allreduce = parallel.data_parallel_seconds(2.0 * GPT.params / 8, plan, SELENE)
    assert parallel.step_time(GPT, replace(plan, dp_overlap=False), SELENE).data_comm_s == pytest.approx(allreduce)
    passes = parallel.layer_passes(parallel.layer_terms(GPT, plan, SELENE), plan)
    backward = GPT.layers * (passes["backward"] + passes["recompute"])
    assert parallel.step_time(GPT, plan, SELENE).data_comm_s == pytest.approx(max(0.0, allreduce - backward))
    # ZeRO-2: the reduce-scatter behind the last backward, the parameter all-gather behind the next forward
    zero = replace(plan, sharding="zero2")
    forward = GPT.layers * passes["forward"]
    assert parallel.step_time(GPT, zero, SELENE).data_comm_s == pytest.approx(
        max(0.0, allreduce / 2 - backward) + max(0.0, allreduce / 2 - forward))


def test_sharding_trades_memory_for_communication_and_optimizer_time():
    plan = parallel.Plan(8, 2, 4, 64, dp_overlap=False)
    ddp, zero, fsdp = (parallel.step_time(GPT, replace(plan, sharding=s), SELENE, OLD)
                       for s in ("ddp", "zero2", "fsdp"))
    assert zero.data_comm_s == pytest.approx(ddp.data_comm_s) and zero.update_s < ddp.update_s
    assert fsdp.data_comm_s >= zero.data_comm_s


def test_tensor_parallelism_across_nodes_is_priced_on_the_network():
    inside, across = (parallel.layer_terms(GPT, parallel.Plan(t, 1, 1, 8), SELENE) for t in (8, 16))
    assert across.tensor_s > inside.tensor_s  # the flat ring waits for the InfiniBand hops


def test_plans_the_model_cannot_run_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="divides the layers"):
        parallel.step_time(GPT, parallel.Plan(8, 5, 1, 64), SELENE)
    with pytest.raises(ValueError, match="sharding"):
        parallel.step_time(GPT, parallel.Plan(8, 1, 1, 64, sharding="zero4"), SELENE)
    with pytest.raises(ValueError, match="recompute"):
        parallel.step_time(GPT, parallel.Plan(8, 1, 1, 64, recompute="some"), SELENE)


# ---- context and expert parallelism (issue 45): closed forms, over varying inputs ---------------------------------

H100 = Cluster(catalog.gpu("H100 SXM5"), catalog.link("NVSwitch (H100, NVLink 4)"), 8,
               catalog.link("InfiniBand NDR"), 8)
#: Mixtral 8x7B (Jiang et al. 2024, Table 1): 8 experts of width 14336, 2 per token, GQA with 8 key/value heads.
MIXTRAL = parallel.Transformer("Mixtral 8x7B", 32, 4096, 32, 4096, 32000, 0, True, 8, False, False, experts=8,
                               top_k=2, expert_ffn=14336)


def test_a_mixture_of_experts_counts_every_expert_as_parameters_and_the_active_ones_as_flops():
    # Mixtral's paper: 46.7B parameters, 12.9B of them used per token
    assert MIXTRAL.params == pytest.approx(46.7e9, rel=0.005)
    active = MIXTRAL.layers * MIXTRAL.active_layer_params + 2 * MIXTRAL.vocab * MIXTRAL.hidden
    assert active == pytest.approx(12.9e9, rel=0.005)
    assert MIXTRAL.forward_flops(1)["layers"] == pytest.approx(2 * 4096 * MIXTRAL.layers * MIXTRAL.active_layer_params)
    assert MIXTRAL.expert_params == pytest.approx(32 * 8 * 3 * 4096 * 14336)


@settings(max_examples=30, deadline=None)
@given(c=st.sampled_from([2, 4, 8, 16]), t=st.sampled_from([1, 2, 4]), b=st.integers(1, 4),
       kv_heads=st.sampled_from([8, 16, 64]))
def test_the_context_ring_sends_c_minus_1_key_value_blocks_per_layer(c, t, b, kv_heads):
    model = replace(GPT, kv_heads=kv_heads, seq=8192)
    plan = parallel.Plan(t, 1, 1, b, b, context=c)
    # one block: k and v of this rank's s/c tokens, 16-bit (context_expert.ring_bytes_per_layer's forward)
    block = context_expert.ring_bytes_per_layer(8192, b, kv_heads // t, model.hidden // model.heads, c)["forward"]
    link = alpha_beta(SELENE.intra) if t * c <= 8 else SELENE.network_per_gpu()
    expected = (c - 1) * link.alpha_s + block * link.beta_s_per_byte
    assert parallel.layer_terms(model, plan, SELENE).context_s == pytest.approx(expected)
    assert parallel.layer_terms(model, plan, SELENE, replace(parallel.Terms(), context_ring=False)).context_s == 0


@settings(max_examples=30, deadline=None)
@given(e=st.sampled_from([2, 4, 8]), k=st.integers(1, 4), tokens=st.integers(1, 8192))
def test_inside_a_node_the_all_to_all_moves_top_k_copies_out_and_back_per_token(e, k, tokens):
    model = replace(MIXTRAL, top_k=k)
    plan = parallel.Plan(1, 1, 8, 8, expert=e)
    nvlink = alpha_beta(H100.intra)
    per_token = context_expert.ep_bytes_per_token(model.hidden, k, e) / 2  # dispatch + combine, one pass
    expected = 2 * (e - 1) * nvlink.alpha_s + tokens * per_token * nvlink.beta_s_per_byte
    assert parallel.expert_seconds(tokens, model, plan, H100) == pytest.approx(expected)


def test_an_ep_group_past_the_node_pays_the_network_for_the_copies_that_leave_it():
    inside = parallel.expert_seconds(4096, MIXTRAL, parallel.Plan(1, 1, 64, 64, expert=8), H100)
    across = parallel.expert_seconds(4096, MIXTRAL, parallel.Plan(2, 1, 32, 64, expert=8), H100)  # 16 GPUs: 2 nodes
    network = H100.network_per_gpu()
    copy = 2 * 4096 * 2 * MIXTRAL.hidden * 2 / 8  # to each of the 8 EP ranks, out and back
    assert across == pytest.approx(2 * 7 * network.alpha_s + 4 * copy * network.beta_s_per_byte)
    assert across > 3 * inside  # NDR's 50 GB/s per GPU against NVLink's 450: the node boundary
    assert parallel.expert_seconds(4096, GPT, parallel.Plan(1, 1, 64, 64, expert=8), H100) == 0  # dense: no EP


def test_ep_adds_its_all_to_all_to_every_pass_and_switches_off():
    plan = parallel.Plan(1, 4, 16, 256, expert=8, sharding="zero1")
    step = parallel.step_time(MIXTRAL, plan, H100)
    one = parallel.layer_terms(MIXTRAL, plan, H100)
    per_layer = 3 * one.expert_s  # forward, backward, full recomputation's forward
    assert step.expert_comm_s == pytest.approx(MIXTRAL.layers / 4 * plan.microbatches * per_layer)
    free = parallel.step_time(MIXTRAL, plan, H100, replace(parallel.Terms(), expert_all_to_all=False))
    assert free.expert_comm_s == 0 and free.step_s < step.step_s
    with pytest.raises(ValueError, match="expert parallelism 3"):
        parallel.step_time(MIXTRAL, replace(plan, expert=3), H100)
