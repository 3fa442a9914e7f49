"""Beyond data parallelism: a transformer trained with tensor x pipeline x data parallelism, and sharded data
parallelism (ZeRO, FSDP), step by step. Every number is **modelled**.

A GPT-style transformer (``layers``, ``hidden`` h, ``heads`` a, sequence s, vocabulary V) on ``t x p x d`` GPUs:

* **tensor parallel** (Megatron-LM, Shoeybi et al. 2019): each layer's matmuls split ``t`` ways inside a node;
  two allreduces of the activations (``s·b·h`` elements) in forward and two in backward per layer, on the
  critical path (nothing to overlap them with), plus two more when the forward is recomputed.
* **pipeline parallel**: ``p`` stages of ``layers/p`` layers; ``m`` microbatches per step. GPipe and 1F1B both
  take ``(m + p - 1)`` microbatch-times (the bubble is ``(p-1)/m`` of the work; 1F1B only holds fewer
  activations); the interleaved schedule with ``v`` chunks per GPU divides the bubble by ``v``. Each microbatch
  sends its activations forward and their gradients back: ``s·b·h`` 16-bit values, 1/t per GPU (scatter-gather).
* **data parallel** over ``d`` replicas, after the pipeline flushes (Megatron overlaps none of it):
  ``ddp`` allreduces the gradients; ``zero1``/``zero2`` reduce-scatter them and all-gather the parameters (the
  same bytes, optimizer state on 1/d of the parameters); ``zero3``/``fsdp`` also all-gather the parameters
  before forward and again before backward (1.5x the bytes), which may overlap compute.
* the last stage also computes the logits (``2·s·h·V·b/t`` FLOPs per microbatch) and sets the pipeline's pace.
* per layer and microbatch: matmul FLOPs ``(24·s·h² + 4·s²·h)·b/t`` at the fitted GEMM efficiency, and element-wise
  traffic of twice the activation bytes Korthikanti et al. 2022 count (``s·b·h·(10 + 24/t + 5·a·s/(h·t))``
  stored per layer) at the memory bandwidth; backward 2x forward.

Throughput is reported as Megatron's papers count it, ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` FLOPs per step with
recomputation (72 without), so modelled and published FLOP/s compare like for like. Taught in
``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.arguments import check_choice, check_count
from course.collectives import cost_model
from course.perf import microbench
from course.perf.comm import Cluster, allreduce_seconds, alpha_beta, message_seconds

SHARDING = ("ddp", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class Transformer:
    """A GPT-style decoder: the sizes its FLOPs, parameters and activations follow from."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200

    @property
    def params(self) -> float:
        return 12.0 * self.layers * self.hidden**2 + (self.vocab + self.seq) * self.hidden

    def megatron_flops(self, batch_size: int, recompute: bool = True) -> float:
        """FLOPs of one step on ``batch_size`` sequences as Megatron counts them (module docstring)."""
        s, h, layer_count = self.seq, self.hidden, self.layers
        factor = 96 if recompute else 72
        return factor * batch_size * s * layer_count * h**2 * (1 + s / (6 * h) + self.vocab / (16 * layer_count * h))


@dataclass(frozen=True)
class Plan:
    """How a transformer is split: ``tensor`` x ``pipeline`` x ``data`` GPUs, and how a step is batched."""

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    global_batch: int = 512     # sequences per step, over all replicas
    microbatch: int = 1         # sequences per microbatch
    sharding: str = "ddp"       # one of SHARDING
    interleave: int = 1         # model chunks per GPU (interleaved 1F1B); 1: plain 1F1B / GPipe
    recompute: bool = True      # full activation recomputation (one more forward in backward)
    precision: str = "fp16"     # 16-bit model: 2-byte activations and gradients; Adam's state in FP32

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.data * self.microbatch)


@dataclass(frozen=True)
class TransformerStep:
    """One modelled step, its parts in seconds, and the throughput it implies."""

    pipeline_s: float       # (m + p - 1) microbatch-times, TP and pipeline traffic included
    bubble_s: float         # the part of pipeline_s no GPU of a stage computes in
    tensor_comm_s: float    # TP allreduces inside pipeline_s
    data_comm_s: float      # the data-parallel collectives' exposed time
    update_s: float         # optimizer step + framework overhead
    step_s: float
    flops_per_gpu: float    # Megatron's count / step / GPUs


def check_plan(model: Transformer, plan: Plan, cluster: Cluster) -> None:
    """Raise a clear error for a plan the model cannot run.

    Raises:
        ValueError: tensor parallel across nodes, layers or batch that do not divide, unknown sharding.
    """
    check_choice("sharding", plan.sharding, SHARDING)
    for name in ("tensor", "pipeline", "data", "microbatch", "interleave"):
        check_count(name, getattr(plan, name), unit="count")
    if plan.tensor > cluster.gpus_per_node:
        raise ValueError(f"tensor parallelism of {plan.tensor} spans nodes of {cluster.gpus_per_node} GPUs; "
                         "keep it inside a node (its allreduces are on the critical path).")
    if model.layers % (plan.pipeline * plan.interleave):
        raise ValueError(f"{model.layers} layers do not split into {plan.pipeline} stages x {plan.interleave} "
                         "chunks; pick a pipeline size that divides the layers.")
    if plan.microbatches < 1 or plan.global_batch % (plan.data * plan.microbatch):
        raise ValueError(f"global batch {plan.global_batch} does not split into {plan.data} replicas x "
                         f"microbatches of {plan.microbatch}.")


def layer_activation_bytes(model: Transformer, microbatch: int, tensor: int) -> float:
    """Bytes one layer saves for backward for one micro-batch, its tensors split ``tensor`` ways:
    ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` with 16-bit activations (Korthikanti et al. 2022, section 4.1)."""
    s, h, b, t = model.seq, model.hidden, microbatch, tensor
    return s * b * h * (10 + 24 / t + 5 * model.heads * s / (h * t))


def layer_seconds(model: Transformer, plan: Plan, cluster: Cluster) -> tuple[float, float]:
    """``(compute, tensor-parallel communication)`` of one layer's forward for one microbatch, seconds."""
    s, h, b, t, gpu = model.seq, model.hidden, plan.microbatch, plan.tensor, cluster.gpu
    flops = (24 * s * h**2 + 4 * s**2 * h) * b / t
    math_s = flops / (gpu.peak_flops(plan.precision) * microbench.matmul_efficiency(plan.precision, gpu.generation))
    stored = layer_activation_bytes(model, b, t)
    memory_s = 2 * stored / (gpu.memory_bandwidth * microbench.constant("memory"))
    tp_s = 2 * allreduce_seconds(2.0 * s * b * h, t, cluster, "ring") if t > 1 else 0.0
    return math_s + memory_s, tp_s


def data_parallel_seconds(nbytes: float, plan: Plan, cluster: Cluster) -> float:
    """One allreduce of ``nbytes`` among the ``d`` replicas that hold the same shard (one per node when a
    replica fills a node or more; several per node otherwise: then two-level)."""
    d = plan.data
    if d == 1:
        return 0.0
    per_node = max(1, cluster.gpus_per_node // (plan.tensor * plan.pipeline))
    if per_node == 1:
        between = cluster.network_per_gpu()
        return float(cost_model.predict("ring", nbytes, d, between))
    nodes = -(-d // per_node)
    if nodes == 1:
        return allreduce_seconds(nbytes, d, cluster, "ring")
    inside, between = alpha_beta(cluster.intra), cluster.network_per_gpu()
    return float(cost_model.predict_hierarchical(nbytes, per_node, nodes, inside, between, within="ring"))


def step_time(model: Transformer, plan: Plan, cluster: Cluster) -> TransformerStep:
    """Model one training step of ``model`` split by ``plan`` on ``cluster`` (module docstring).

    Raises:
        ValueError: see :func:`check_plan`.
    """
    check_plan(model, plan, cluster)
    t, p, d, m = plan.tensor, plan.pipeline, plan.data, plan.microbatches
    compute, tp = layer_seconds(model, plan, cluster)
    per_stage = model.layers / p
    logits = 2.0 * model.seq * model.hidden * model.vocab * plan.microbatch / t  # the last stage's extra work
    logits_s = logits / (cluster.gpu.peak_flops(plan.precision)
                         * microbench.matmul_efficiency(plan.precision, cluster.gpu.generation))
    passes = 4 if plan.recompute else 3  # forward, backward (2x), and the recomputed forward
    tp_passes = 3 if plan.recompute else 2  # TP allreduce pairs: forward, backward, recomputed forward
    micro_compute = per_stage * compute * passes + logits_s * 3  # the slowest (last) stage sets the pace
    micro_tp = per_stage * tp * tp_passes
    p2p = 2 * message_seconds(2.0 * model.seq * plan.microbatch * model.hidden / t, cluster.network_per_gpu()) \
        if p > 1 else 0.0
    micro = micro_compute + micro_tp + p2p
    bubble = (p - 1) / plan.interleave * micro
    pipeline_s = m * micro + bubble
    data_comm = _data_comm_exposed(model, plan, cluster, m * micro)
    shards = d if plan.sharding != "ddp" else 1
    adam = 28.0  # bytes per parameter: FP32 master, m and v read and written, 16-bit gradient in, weight out
    update = (model.params / (t * p) / shards * adam / (cluster.gpu.memory_bandwidth * microbench.constant("memory"))
              + microbench.constant("framework"))
    step = pipeline_s + data_comm + update
    flops = model.megatron_flops(plan.global_batch, plan.recompute) / step / plan.gpus
    return TransformerStep(pipeline_s, bubble, m * micro_tp, data_comm, update, step, flops)


def _data_comm_exposed(model: Transformer, plan: Plan, cluster: Cluster, pipeline_s: float) -> float:
    """The data-parallel collectives' time not hidden: DDP and ZeRO-1/2 after the flush (Megatron overlaps
    none); ZeRO-3/FSDP's extra parameter all-gathers overlap the pipeline's compute (prefetched per layer)."""
    grads = 2.0 * model.params / (plan.tensor * plan.pipeline)  # 16-bit gradients of one replica's shard
    reduce = data_parallel_seconds(grads, plan, cluster)
    if plan.sharding in ("zero3", "fsdp"):
        gathers = reduce  # two all-gathers of the parameters = one allreduce's bytes
        return reduce + max(0.0, gathers - pipeline_s)
    return reduce
