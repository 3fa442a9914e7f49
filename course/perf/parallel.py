"""Beyond data parallelism: a transformer trained with tensor x context x pipeline x data parallelism, and sharded
data parallelism (ZeRO, FSDP), step by step. Every number is **modelled**.

A decoder (:class:`~course.perf.transformer.Transformer`: ``layers``, ``hidden`` h, ``heads`` a, sequence s,
vocabulary V, the MLP's width) on ``t x c x p x d`` GPUs. One layer, one microbatch of ``b`` sequences, per GPU
(:func:`layer_terms`):

* **GEMMs**: the layer's weight GEMMs (``24·(s/c)·b·h²/t`` FLOPs for a GPT), each at the microbenchmark efficiency
  of its reduction depth (:func:`course.perf.microbench.gemm_efficiency`) times the sustained fraction fitted on
  the fitting set (:func:`course.perf.microbench.training_efficiency`), over the useful share of its tiles and
  waves, forward and backward (:mod:`course.perf.gemm_shape`).
* **attention**: ``4·(s/c)·s·b·h/t`` FLOPs. Unfused: two batched GEMMs, ``QKᵀ`` of depth ``h/a`` and the scores
  times ``V`` of depth ``s``. A **fused** (flash) kernel skips the masked half of causal attention and runs at
  FlashAttention's published fraction of the peak, with no shallow-GEMM penalty.
* **element-wise traffic** (norms, softmax, activations, residuals): twice the activation bytes Korthikanti et al.
  2022 count, ``(s/c)·b·h·(10 + 24/t + 5·a·s/(h·t))`` for a GPT, at the memory bandwidth. A fused attention
  kernel never writes the ``s x s`` scores to memory: the ``5·a·s/(h·t)`` term goes.
* **launches**: a layer takes at least its kernels' launch time on the CPU.
* **tensor parallel** (Megatron-LM, Shoeybi et al. 2019): two allreduces of ``2·(s/c)·b·h`` bytes among ``t`` GPUs
  in forward, two in backward, two more in a recomputed forward. With ``tp_overlap`` they hide behind the GEMMs:
  only ``max(0, comm - GEMMs)`` is exposed.
* **context parallel** (ring attention, Megatron-LM's ``--context-parallel-size``): the sequence is split ``c``
  ways; each GPU passes its keys and values around a ring, ``(c-1)`` messages of ``4·(s/c)·b·h_kv/t`` bytes in
  forward and twice that in backward, overlapped with the attention (only the excess is exposed).
* **expert parallel** (a mixture of experts, :attr:`Transformer.experts`; Megatron-Core's
  ``--expert-model-parallel-size``): the experts are split ``e`` ways among the data x context ranks; each MoE
  layer sends every token to its ``top_k`` experts and back (dispatch and combine, :func:`expert_seconds`), in
  forward and again in backward, not overlapped. The copies bound for another node cross the network, the others
  NVLink: the two run side by side, so the slower sets the time. That is why EP groups stay inside a node.
* backward costs twice forward; recomputation adds a forward (``"full"``), the attention core (``"selective"``,
  Korthikanti et al. 2022) or nothing (``"none"``).

The step (:func:`step_time`):

* **pipeline**: ``p`` stages (``stage_layers`` may be uneven), ``m`` microbatches. 1F1B takes
  ``m·t_max + (Σ t_i - t_max)/v`` (even stages: ``(m + (p-1)/v)`` microbatch-times; the bubble is ``(p-1)/v`` of
  the work), where ``v`` is the number of model chunks per GPU (the **interleaved** schedule, chosen whenever
  ``interleave > 1``). Each microbatch sends its activations forward and their gradients back at each of the
  ``v`` chunk boundaries a GPU owns: ``2·v`` messages of ``2·(s/c)·b·h/t`` bytes. The last stage also computes the
  logits (``2·(s/c)·h·V·b/t`` FLOPs).
* **data parallel** over ``d·c`` GPUs holding the same shard (:mod:`course.perf.sharding`): ``ddp`` allreduces the
  gradients once per step; ``zero1`` reduce-scatters them once and all-gathers the updated parameters; ``zero2``,
  ``zero3`` and ``fsdp`` reduce-scatter after **every** microbatch's backward; ``zero3``/``fsdp`` also all-gather
  the parameters, layer by layer, before each microbatch's forward and again before its backward (once, without
  ``reshard_after_forward``). With ``dp_overlap`` each collective hides behind the compute it overlaps.
* the optimizer step (Adam, memory-bound) on this GPU's shard and a per-step framework overhead.

Each newer term can be switched off (:class:`~course.perf.sharding.Terms`). Throughput is reported both ways
(:mod:`course.perf.transformer`): hardware FLOPs, recomputation counted, as Megatron-LM's papers report TFLOP/s
(``96·B·s·l·h²·(1 + s/6h + V/16lh)`` with full recomputation), and model FLOPs, as MFU counts them. Not modelled:
network oversubscription, stragglers, uneven routing (EP assumes every expert gets its share). The pipeline's
ends (the loss, the embedding, tied embeddings' all-reduce), gradient clipping and the price of TP overlap:
:mod:`course.perf.beyond_layers`. Taught in
``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.arguments import check_choice, check_count
from course.perf import beyond_layers, gemm_shape, microbench
from course.perf.comm import Cluster, allreduce_seconds, alpha_beta, message_seconds
from course.perf.sharding import ALL_TERMS, Terms, data_parallel_seconds, exposed_seconds, sharding_seconds
from course.perf.transformer import RECOMPUTE, Transformer

__all__ = ["RECOMPUTE", "SHARDING", "LayerTerms", "Plan", "Terms", "Transformer", "TransformerStep",
           "data_parallel_seconds", "expert_seconds", "layer_passes", "layer_terms", "pipeline_seconds",
           "sharding_seconds", "step_time"]

SHARDING = ("ddp", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class Plan:
    """How a transformer is split and how a step runs: the *setup* a run states, never a fitted efficiency.

    The overlap defaults follow the frameworks people train with today:

    * ``dp_overlap=True``: PyTorch's DDP launches each gradient bucket's allreduce as soon as it is full, during
      backward, always (https://pytorch.org/docs/stable/notes/ddp.html); FSDP prefetches the next parameter
      all-gather by default (``backward_prefetch=BACKWARD_PRE``,
      https://pytorch.org/docs/stable/fsdp.html). Megatron-LM has it as ``--overlap-grad-reduce`` and
      ``--overlap-param-gather`` (off unless asked for, and Narayanan et al. 2021 overlapped none).
    * ``tp_overlap=False``: Megatron-LM's ``--tp-comm-overlap`` (Transformer Engine's userbuffers, which pipeline
      the sequence-parallel all-gather and reduce-scatter with the GEMMs) is off unless asked for
      (https://github.com/NVIDIA/Megatron-LM, ``megatron/training/arguments.py``).
    * ``fused_attention=True``: PyTorch's ``scaled_dot_product_attention`` and Megatron-Core's Transformer Engine
      attention pick a fused (flash) kernel when one exists
      (https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html).
    * ``reshard_after_forward=True``: FSDP's ``FULL_SHARD`` / FSDP2's default frees the gathered parameters after
      forward and gathers them again for backward (https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html).
    * ``fp32_grad_reduce=False``: gradients reduced in the parameters' 16 bits (FSDP's ``MixedPrecision`` with
      ``reduce_dtype`` bf16); Megatron-LM with bf16, torchtitan and Llama 3 reduce them in FP32
      (:class:`~course.perf.sharding.Terms`' ``fp32_grad_reduce`` gives the sources).
    * ``accumulate_grads=False``: ZeRO-2/3 and FSDP reduce-scatter after every micro-batch. Llama 3 instead uses
      "FP32 gradient accumulation during backward computation over multiple micro-batches" and then
      "reduce-scatter[s] gradients in FP32" (Llama Team 2024, section 3.3.2): one reduction per step.
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    global_batch: int = 512     # sequences per step, over all replicas
    microbatch: int = 1         # sequences per microbatch
    sharding: str = "ddp"       # one of SHARDING
    interleave: int = 1         # model chunks per GPU (virtual stages: interleaved 1F1B); 1: plain 1F1B
    recompute: str = "full"     # one of RECOMPUTE: activation recomputation in backward
    precision: str = "fp16"     # 16-bit model: 2-byte activations and gradients; Adam's state in FP32
    context: int = 1            # context parallelism: the sequence split over this many GPUs
    stage_layers: tuple[int, ...] = ()  # layers of each pipeline stage; () for layers/pipeline each
    fused_attention: bool = True        # a fused attention kernel: no s x s scores in memory
    tp_overlap: bool = False            # tensor-parallel collectives hidden behind the GEMMs
    dp_overlap: bool = True             # data-parallel collectives hidden behind backward (and forward)
    reshard_after_forward: bool = True  # zero3/fsdp: gather the parameters again for backward
    expert: int = 1                     # expert parallelism: the experts split over this many of the d x c GPUs
    fp32_grad_reduce: bool = False      # gradients reduced (and accumulated) in FP32: 4 bytes each
    accumulate_grads: bool = False      # zero2/3, fsdp: gradients kept whole over the micro-batches, reduced once

    @property
    def gpus(self) -> int:
        return self.tensor * self.context * self.pipeline * self.data

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.data * self.microbatch)

    def layers_per_stage(self, layers: int) -> tuple[int, ...]:
        """Layers held by each pipeline stage: ``stage_layers``, or ``layers / pipeline`` each."""
        return self.stage_layers or (layers // self.pipeline,) * self.pipeline


@dataclass(frozen=True)
class TransformerStep:
    """One modelled step, its parts in seconds, and the throughput it implies.

    ``flops_per_gpu`` counts recomputation (hardware FLOPs, as Megatron-LM's papers report TFLOP/s);
    ``model_flops_per_gpu`` does not (what MFU divides by the peak): :mod:`course.perf.transformer`."""

    pipeline_s: float       # the 1F1B schedule's time: microbatches, bubble, TP, CP and pipeline traffic included
    bubble_s: float         # the part of pipeline_s no GPU of the slowest stage computes in
    tensor_comm_s: float    # exposed TP allreduces inside pipeline_s
    data_comm_s: float      # the data-parallel collectives' exposed time
    update_s: float         # optimizer step + framework overhead
    step_s: float
    flops_per_gpu: float    # hardware FLOPs (recomputation counted) / step / GPUs
    context_comm_s: float = 0.0  # exposed context-parallel ring traffic inside pipeline_s
    p2p_s: float = 0.0           # pipeline sends inside pipeline_s
    model_flops_per_gpu: float = 0.0  # model FLOPs (no recomputation) / step / GPUs
    peak_flops: float = 0.0           # the GPU's peak at the plan's precision
    expert_comm_s: float = 0.0        # expert-parallel all-to-all (dispatch and combine) inside pipeline_s

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOP/s over the peak (PaLM's definition; recomputation not counted)."""
        return self.model_flops_per_gpu / self.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: the FLOP/s the GPUs ran, recomputation included, over the peak."""
        return self.flops_per_gpu / self.peak_flops


@dataclass(frozen=True)
class LayerTerms:
    """One layer's forward for one microbatch on one GPU, term by term (seconds; see :func:`layer_terms`)."""

    gemm_s: float        # the four weight GEMMs
    attention_s: float   # the two attention GEMMs
    memory_s: float      # element-wise traffic, the attention's share included
    attention_memory_s: float  # the part of memory_s that the s x s scores cause (0 with a fused kernel)
    tensor_s: float      # TP collectives of one pass (two allreduces), before any overlap
    context_s: float     # CP ring traffic of one forward, before any overlap
    launch_s: float = 0.0  # CPU time to launch the layer's forward kernels: a floor under its compute
    expert_s: float = 0.0  # EP all-to-all (dispatch and combine) of one pass, never overlapped

    @property
    def compute_s(self) -> float:
        return max(self.gemm_s + self.attention_s + self.memory_s, self.launch_s)


def check_plan(model: Transformer, plan: Plan, cluster: Cluster) -> None:
    """Raise a clear error for a plan the model cannot run.

    Raises:
        ValueError: layers or batch that do not divide, uneven stages that do not add up, unknown options.
    """
    check_choice("sharding", plan.sharding, SHARDING)
    check_choice("recompute", plan.recompute, RECOMPUTE)
    for name in ("tensor", "pipeline", "data", "microbatch", "interleave", "context", "expert"):
        check_count(name, getattr(plan, name), unit="count")
    if plan.stage_layers:
        if len(plan.stage_layers) != plan.pipeline or sum(plan.stage_layers) != model.layers:
            raise ValueError(f"stage_layers {plan.stage_layers} must give each of the {plan.pipeline} stages its "
                             f"layers, {model.layers} in all.")
    elif model.layers % (plan.pipeline * plan.interleave):
        raise ValueError(f"{model.layers} layers do not split into {plan.pipeline} stages x {plan.interleave} "
                         "chunks; pick a pipeline size that divides the layers.")
    if plan.microbatches < 1 or plan.global_batch % (plan.data * plan.microbatch):
        raise ValueError(f"global batch {plan.global_batch} does not split into {plan.data} replicas x "
                         f"microbatches of {plan.microbatch}.")
    if plan.interleave > 1 and plan.microbatches % plan.pipeline:
        raise ValueError(f"the interleaved schedule runs microbatches in groups of the {plan.pipeline} stages; "
                         f"{plan.microbatches} microbatches do not divide: change the batch or set interleave=1.")
    if model.seq % plan.context:
        raise ValueError(f"a sequence of {model.seq} tokens does not split into {plan.context} context-parallel "
                         "parts; pick a context size that divides it.")
    if plan.expert > 1 and (not model.moe or model.experts % plan.expert or (plan.data * plan.context) % plan.expert):
        raise ValueError(f"expert parallelism {plan.expert} must divide the {model.experts} experts and the "
                         f"{plan.data * plan.context} data x context GPUs it is drawn from; pick a divisor of both.")


def _gemm_s(flops: float, depth: float, plan: Plan, cluster: Cluster) -> float:
    """One GEMM of ``flops`` FLOPs and reduction depth ``depth`` on the cluster's GPU, at the fraction of the
    microbenchmark's rate that a training step sustains (:func:`course.perf.microbench.training_efficiency`)."""
    gpu = cluster.gpu
    return flops / (gpu.peak_flops(plan.precision) * microbench.training_efficiency(gpu.generation)
                    * microbench.gemm_efficiency(plan.precision, gpu.generation, depth, gpu.name))


def _weight_gemm_s(tokens: float, weights: float, depth: float, plan: Plan, cluster: Cluster, terms: Terms) -> float:
    """One weight GEMM's forward (``tokens`` rows times ``weights`` per token, reduction depth ``depth``), priced
    with the useful share of its forward and backward tiles (``terms.gemm_quantisation``, :mod:`gemm_shape`)."""
    seconds = _gemm_s(2 * tokens * weights, depth, plan, cluster)
    if not terms.gemm_quantisation:
        return seconds
    return seconds / gemm_shape.weight_gemm_quantisation(tokens, weights / depth, depth, cluster.gpu.name)


def _flash_s(flops: float, plan: Plan, cluster: Cluster) -> float:
    """A fused attention kernel of ``flops`` FLOPs at its published fraction of the 16-bit peak."""
    gpu = cluster.gpu
    return flops / (gpu.peak_flops(plan.precision) * microbench.training_efficiency(gpu.generation)
                    * microbench.attention_efficiency(gpu.generation))


#: Kernels one layer's forward launches: four weight GEMMs, two norms, two residual adds, the activation, and
#: the attention (one fused kernel, or scores, scale and mask, softmax, dropout and the product with V).
KERNELS = {"fused": 10, "unfused": 14}


def expert_seconds(tokens: float, model: Transformer, plan: Plan, cluster: Cluster) -> float:
    """One MoE layer's dispatch and combine for ``tokens`` tokens on one GPU (one pass; backward sends the
    gradients the same way). Each token's ``top_k`` copies go to ``e`` GPUs evenly, so ``(e-1)/e`` of them leave
    the GPU (:func:`course.perf.context_expert.ep_bytes_per_token`). Megatron-Core orders ranks tensor, context,
    expert, data: an EP group of ``e`` spans ``t·c·e`` GPUs, ``g = gpus_per_node/(t·c)`` of them per node. The
    copies to the ``g-1`` others of the node go over NVLink, those to the ``e-g`` beyond it over the network,
    side by side: the slower link sets the time. 0 without expert parallelism."""
    e = plan.expert
    if e == 1 or not model.moe:
        return 0.0
    per_node = max(1, min(e, cluster.gpus_per_node // (plan.tensor * plan.context)))
    copy = 2 * tokens * model.top_k * model.hidden * 2 / e  # 16-bit, out and back, to each of the e GPUs
    inside = (per_node - 1) * copy * alpha_beta(cluster.intra).beta_s_per_byte
    between = (e - per_node) * copy * cluster.network_per_gpu().beta_s_per_byte if e > per_node else 0.0
    latency = 2 * (e - 1) * (alpha_beta(cluster.intra) if e == per_node else cluster.network_per_gpu()).alpha_s
    return latency + max(inside, between)


def layer_terms(model: Transformer, plan: Plan, cluster: Cluster, terms: Terms = ALL_TERMS) -> LayerTerms:
    """Every term of one layer's forward for one microbatch on one GPU (module docstring)."""
    s, h, a, b, t, c = model.seq, model.hidden, model.heads, plan.microbatch, plan.tensor, plan.context
    tokens = s / c * b  # this GPU's queries
    gemm = sum(_weight_gemm_s(tokens, weights, depth, plan, cluster, terms) for weights, depth in model.layer_gemms(t))
    scores = 2 * tokens * s * h / t  # FLOPs of Q Kᵀ, and again of the scores times V
    if plan.fused_attention and terms.flash_rate:  # one tiled kernel: no shallow GEMM, the masked half skipped
        attention = 2 * _flash_s(scores / 2, plan, cluster)
    else:  # Q Kᵀ has the head dimension as its depth; scores x V has the keys
        attention = _gemm_s(scores, h / a, plan, cluster) + _gemm_s(scores, s, plan, cluster)
    bandwidth = cluster.gpu.memory_bandwidth * microbench.constant("memory") if terms.memory_kernels else float("inf")
    score_bytes = 0.0 if plan.fused_attention else 2 * tokens * h * 5 * a * s / (h * t) / bandwidth
    split = 8 + (6 if model.gated else 4) * model.active_ffn / h  # Korthikanti's 24/t, for any MLP
    memory = 2 * tokens * h * (10 + split / t) / bandwidth + score_bytes  # bytes, Korthikanti et al. 2022
    tensor = 2 * allreduce_seconds(2.0 * tokens * h, t, cluster, "ring") if t > 1 else 0.0
    ring = alpha_beta(cluster.intra) if t * c <= cluster.gpus_per_node else cluster.network_per_gpu()
    context = (c - 1) * message_seconds(4.0 * tokens * model.kv_width / t, ring) if c > 1 else 0.0  # K and V
    if not terms.context_ring:
        context = 0.0
    expert = expert_seconds(tokens / t, model, plan, cluster) if terms.expert_all_to_all else 0.0
    kernels = KERNELS["fused" if plan.fused_attention else "unfused"] + (2 if t > 1 else 0)
    launch = kernels * microbench.constant("launch") if terms.overheads else 0.0
    return LayerTerms(gemm, attention, memory, score_bytes, tensor, context, launch, expert)


def _exposed(comm_s: float, hidden_by_s: float, overlap: bool) -> float:
    """The part of ``comm_s`` that compute of ``hidden_by_s`` does not hide (all of it without overlap)."""
    return max(0.0, comm_s - hidden_by_s) if overlap else comm_s


def layer_passes(terms: LayerTerms, plan: Plan, overlap_cost: dict[str, float] | None = None) -> dict[str, float]:
    """One layer's forward, backward and recomputation for one microbatch, each with its exposed TP, CP and EP
    traffic: ``{"forward", "backward", "recompute", "tensor", "context", "expert"}`` (the last three: exposed
    traffic of all passes).
    ``overlap_cost``: what hiding the TP traffic adds to each pass (:func:`course.perf.beyond_layers.tp_overlap_cost`),
    counted as TP time."""
    cost = overlap_cost if plan.tp_overlap and overlap_cost else {"forward": 0.0, "backward": 0.0}
    tp_forward = _exposed(terms.tensor_s, terms.gemm_s, plan.tp_overlap) + cost["forward"]
    tp_backward = _exposed(terms.tensor_s, 2 * terms.gemm_s, plan.tp_overlap) + cost["backward"]
    cp_forward = max(0.0, terms.context_s - terms.attention_s)  # the ring always runs beside the attention
    cp_backward = max(0.0, 2 * terms.context_s - 2 * terms.attention_s)
    forward = terms.compute_s + tp_forward + cp_forward + terms.expert_s
    backward = 2 * terms.compute_s + tp_backward + cp_backward + terms.expert_s
    recompute = {"full": forward, "none": 0.0,
                 "selective": terms.attention_s + terms.attention_memory_s}[plan.recompute]
    tp_recompute = tp_forward if plan.recompute == "full" else 0.0
    cp_recompute = cp_forward if plan.recompute == "full" else 0.0
    ep_recompute = terms.expert_s if plan.recompute == "full" else 0.0
    return {"forward": forward, "backward": backward, "recompute": recompute,
            "tensor": tp_forward + tp_backward + tp_recompute, "context": cp_forward + cp_backward + cp_recompute,
            "expert": 2 * terms.expert_s + ep_recompute}


def pipeline_seconds(stage_s: list[float], microbatches: int, interleave: int) -> tuple[float, float]:
    """``(schedule, bubble)`` of 1F1B over stages taking ``stage_s`` per microbatch: ``m·t_max`` of work and a
    bubble of ``(Σ t_i - t_max) / v`` (even stages: ``(p-1)/v`` microbatch-times)."""
    slowest = max(stage_s)
    bubble = (sum(stage_s) - slowest) / interleave
    return microbatches * slowest + bubble, bubble


def shard_params(model: Transformer, plan: Plan) -> float:
    """Parameters one GPU holds before ZeRO sharding: ``1/(t·p)`` of the model, and only ``1/e`` of the routed
    experts under expert parallelism (their gradients are priced over the same ``d·c`` group: an approximation,
    Megatron-Core reduces them among the ``d·c/e`` GPUs that hold the same experts)."""
    experts = model.expert_params * (1 - 1 / plan.expert)
    return (model.params - experts) / (plan.tensor * plan.pipeline)


def update_seconds(model: Transformer, plan: Plan, cluster: Cluster, terms: Terms = ALL_TERMS) -> float:
    """The optimizer step on this GPU's shard (Adam: 28 bytes per parameter at the memory bandwidth) and the
    per-step framework overhead, each with its term."""
    shards = plan.data * plan.context if plan.sharding != "ddp" else 1
    adam = 28.0  # bytes per parameter: FP32 master, m and v read and written, 16-bit gradient in, weight out
    moved = shard_params(model, plan) / shards * adam
    optimizer = moved / (cluster.gpu.memory_bandwidth * microbench.constant("memory")) if terms.memory_kernels else 0
    if terms.grad_clipping:
        optimizer += beyond_layers.clipping_seconds(moved / adam, cluster)
    return optimizer + (microbench.constant("framework") if terms.overheads else 0.0)


def step_time(model: Transformer, plan: Plan, cluster: Cluster, terms: Terms = ALL_TERMS) -> TransformerStep:
    """Model one training step of ``model`` split by ``plan`` on ``cluster`` (module docstring); ``terms`` switches
    the model's newer terms (:class:`course.perf.sharding.Terms`, all on by default).

    Raises:
        ValueError: see :func:`check_plan`.
    """
    check_plan(model, plan, cluster)
    t, m, v = plan.tensor, plan.microbatches, plan.interleave
    one = layer_terms(model, plan, cluster, terms)
    partial = terms.tp_overlap_partial and plan.tp_overlap and t > 1
    cost = beyond_layers.tp_overlap_cost(one.tensor_s, cluster.gpu.name) if partial else None
    per_layer = layer_passes(one, plan, cost)
    layer_s = per_layer["forward"] + per_layer["backward"] + per_layer["recompute"]
    tokens = model.seq / plan.context * plan.microbatch
    logits_s = 3 * _weight_gemm_s(tokens, model.hidden * model.vocab / t, model.hidden, plan, cluster, terms)
    first_s = 0.0
    if terms.pipeline_ends:  # the loss on the last stage, the embedding on the first
        logits_s += beyond_layers.loss_seconds(model, tokens, t, cluster)
        first_s = beyond_layers.embedding_seconds(model, tokens, cluster)
    p2p = (2 * v * message_seconds(2.0 * tokens * model.hidden / t, cluster.network_per_gpu())
           if plan.pipeline > 1 else 0.0)
    layers = plan.layers_per_stage(model.layers)
    stage_s = [n * layer_s + p2p + (logits_s if i == len(layers) - 1 else 0.0) + (first_s if i == 0 else 0.0)
               for i, n in enumerate(layers)]
    pipeline_s, bubble = pipeline_seconds(stage_s, m, v)
    n = layers[max(range(len(layers)), key=lambda i: stage_s[i])]  # layers of the slowest stage
    reduce_s, gather_s = sharding_seconds(model, plan, cluster, terms)
    stage = {"forward": n * per_layer["forward"], "backward": n * (per_layer["backward"] + per_layer["recompute"])}
    data_comm = exposed_seconds(reduce_s, gather_s, plan, stage, terms)
    update = update_seconds(model, plan, cluster, terms)
    if terms.pipeline_ends:  # after the pipeline drains, before the optimizer: exposed
        data_comm += beyond_layers.tied_embedding_seconds(model, t, plan.pipeline, plan.precision, cluster)
    step = pipeline_s + data_comm + update
    hardware = model.hardware_flops(plan.global_batch, plan.recompute) / step / plan.gpus
    model_flops = model.model_flops(plan.global_batch) / step / plan.gpus
    return TransformerStep(pipeline_s, bubble, n * m * per_layer["tensor"], data_comm, update, step, hardware,
                           n * m * per_layer["context"], m * p2p, model_flops, cluster.gpu.peak_flops(plan.precision),
                           n * m * per_layer["expert"])
