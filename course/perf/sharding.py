"""Data-parallel traffic of a transformer step: the gradients' reduction and, when sharded, the parameters' gathers.
Every number is **modelled**.

The ``d·c`` GPUs that hold the same shard of the model (data x context parallel) exchange it:

* ``ddp``: one allreduce of the gradients per step, after the last micro-batch's backward: 16-bit, or 32-bit
  where the plan says ``fp32_grad_reduce`` (Megatron-LM with bf16, torchtitan, Llama 3: :class:`Terms`).
* ``zero1``: a reduce-scatter of the gradients per step, an all-gather of the updated parameters.
* ``zero2``: the same, but the gradients are sharded, so they are **reduce-scattered after every micro-batch's
  backward** (DeepSpeed's ZeRO-2 and PyTorch's FSDP with ``SHARD_GRAD_OP`` keep no full gradient to accumulate
  into), ``m`` reduce-scatters per step.
* ``zero3``/``fsdp``: a reduce-scatter after every micro-batch's backward (once per step where the plan
  ``accumulate_grads``: Llama 3 accumulates its gradients in FP32 over the micro-batches), and the parameters
  gathered before each micro-batch's forward and again before its backward (once with
  ``reshard_after_forward=False``). FSDP does it one layer (one wrapped unit) at a time: ``layers`` collectives,
  each paying its latency.

A reduce-scatter or an all-gather moves half an allreduce's bytes in half its steps. Across nodes the allreduce is
the faster of NCCL's ring and its pipelined tree, as NCCL's tuner picks per size: at a thousand GPUs the
ring's ``2(n-1)`` latency steps lose to the tree's ``2·log2(nodes) + 2(g-1)``. Taught in
``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.collectives import cost_model
from course.perf.comm import Cluster, allreduce_seconds, alpha_beta
from course.perf.transformer import Transformer


@dataclass(frozen=True)
class Terms:
    """The model's switchable terms (issue 44), all on by default; each off gives the older, simpler price.

    Attributes:
        per_microbatch_reduce: ZeRO-2/3 and FSDP reduce-scatter the gradients after every micro-batch's backward
            (off: once per step).
        memory_kernels: normalisation, softmax, element-wise kernels and the optimizer step priced by HBM bandwidth
            (off: not in the step).
        overheads: kernel launches (a layer takes at least its launches' CPU time) and the per-step framework
            overhead (off: neither).
        nccl_algorithms: data-parallel allreduces at the faster of ring and NCCL's tree, and FSDP's collectives
            layer by layer, each with its latency (off: one two-level ring per step).
        flash_rate: a fused (flash) attention kernel runs at the GEMM's best-shape rate (off: the k-depth penalty
            of an unfused ``QKᵀ`` with k = the head dimension).
        pipeline_ends: the loss on the last stage, the embedding on the first, and tied embeddings' gradient
            all-reduce between them (:mod:`course.perf.beyond_layers`; off: the logits GEMM only).
        grad_clipping: the gradients' norm and scaling beside the optimizer step (off: Adam only).
        tp_overlap_partial: with ``tp_overlap``, the last chunk of each forward reduce-scatter exposed and the
            SMs that Transformer Engine's collectives take from the GEMMs (off: all hidden, for free).
        context_ring: context parallelism's ring of key/value blocks, beside the attention (off: free).
        expert_all_to_all: expert parallelism's dispatch and combine, NVLink inside a node and the network
            beyond it (off: free).
        fp32_grad_reduce: a plan with ``fp32_grad_reduce`` reduces 4-byte gradients (off: 2 bytes, as its
            parameters). Megatron-LM forces it with bf16 (``megatron/training/arguments.py``: "accumulate and
            all-reduce gradients in fp32 for bfloat16 data type"); torchtitan's ``mixed_precision_reduce`` is
            ``"float32"`` by default; Llama 3 (section 3.3.2) reduce-scatters its gradients in FP32.
        flat_ring: NCCL's ring across nodes is one ring through every GPU of the group: ``2(n-1)`` steps, of
            which ``2(nodes-1)`` cross the network, each step at its own link's latency, and one rate, the slower
            link's (``src/graph/tuning.cc``: ``(nsteps - nInterSteps)·intraLat + nInterSteps·interLat``); the tree
            takes ``2((g-1)·intraLat + log2(nodes)·interLat)``. Off: the two-level formula (a ring inside each
            node, then one across), its inside and across times added, and every tree step at the slower latency.
        gemm_quantisation: each weight GEMM (and the logits) loses the padded work of its tiles and the idle SMs
            of its last wave, forward and backward (:mod:`course.perf.gemm_shape`: NVIDIA's matrix multiplication
            guide, sections 3.1 and 3.2; the tiles of its section 2.3; the whitepapers' SM counts). Off: every
            shape at the best shape's rate (the depth term aside).
    """

    per_microbatch_reduce: bool = True
    memory_kernels: bool = True
    overheads: bool = True
    nccl_algorithms: bool = True
    flash_rate: bool = True
    pipeline_ends: bool = True
    grad_clipping: bool = True
    tp_overlap_partial: bool = True
    context_ring: bool = True
    expert_all_to_all: bool = True
    fp32_grad_reduce: bool = True
    flat_ring: bool = True
    gemm_quantisation: bool = True


#: Every term on: the default of every function that takes ``terms``.
ALL_TERMS = Terms()


def data_parallel_seconds(nbytes: float, plan: object, cluster: Cluster, terms: Terms = ALL_TERMS) -> float:
    """One allreduce of ``nbytes`` among the ``d·c`` GPUs that hold the same shard, placed as Megatron-LM places
    them (tensor, then context, then data ranks fill a node; pipeline stages outermost): one per node when
    ``t·c`` fills a node, otherwise two-level; with ``terms.nccl_algorithms``, NCCL's pipelined tree when faster."""
    d = plan.data * plan.context
    if d == 1:
        return 0.0
    per_node = min(d, max(1, cluster.gpus_per_node // plan.tensor))
    if per_node == 1:
        between = cluster.network_per_gpu()
        algorithms = ("ring", cost_model.PIPELINED_TREE) if terms.nccl_algorithms else ("ring",)
        return min(float(cost_model.predict(a, nbytes, d, between)) for a in algorithms)
    nodes = -(-d // per_node)
    if nodes == 1:
        return allreduce_seconds(nbytes, d, cluster, "ring")
    inside, between = alpha_beta(cluster.intra), cluster.network_per_gpu()
    if terms.flat_ring and terms.nccl_algorithms:
        return _nccl_seconds(nbytes, d, per_node, nodes, inside, between)
    ring = float(cost_model.predict_hierarchical(nbytes, per_node, nodes, inside, between, within="ring"))
    if not terms.nccl_algorithms:
        return ring
    tree_steps = cost_model.coefficients(cost_model.PIPELINED_TREE, nodes)[0] + 2 * (per_node - 1)
    tree = tree_steps * max(inside.alpha_s, between.alpha_s) + 2 * nbytes * between.beta_s_per_byte / per_node
    return min(ring, tree)


def _nccl_seconds(nbytes: float, n: int, per_node: int, nodes: int, inside: cost_model.AlphaBeta,
                  between: cost_model.AlphaBeta) -> float:
    """The faster of NCCL's flat ring and its tree for ``n`` GPUs, ``per_node`` on each of ``nodes`` nodes
    (:class:`Terms`' ``flat_ring``, as NCCL's tuner prices them). ``between`` is one GPU's share of the network:
    the group's ``per_node`` GPUs of a node share ``per_node`` such shares."""
    slower = max(inside.beta_s_per_byte, between.beta_s_per_byte / per_node)  # the ring runs at its slower link
    ring = (2 * (n - nodes) * inside.alpha_s + 2 * (nodes - 1) * between.alpha_s
            + 2 * (n - 1) / n * nbytes * slower)
    depth = cost_model.coefficients(cost_model.PIPELINED_TREE, nodes)[0] / 2  # ceil(log2(nodes))
    tree = (2 * ((per_node - 1) * inside.alpha_s + depth * between.alpha_s)
            + 2 * nbytes * between.beta_s_per_byte / per_node)
    return min(ring, tree)


def _latency(plan: object, cluster: Cluster, terms: Terms) -> float:
    """The latency part of one reduce-scatter or all-gather among the ``d·c`` GPUs (half an allreduce's steps)."""
    return data_parallel_seconds(0.0, plan, cluster, terms) / 2


def sharding_seconds(model: Transformer, plan: object, cluster: Cluster, terms: Terms = ALL_TERMS
                     ) -> tuple[float, float]:
    """``(gradient reductions, parameter gathers)`` of one step, before any overlap, for ``plan.sharding`` (module
    docstring). Each reduce-scatter or all-gather is half of :func:`data_parallel_seconds`; FSDP's per-layer
    collectives (with ``terms.nccl_algorithms``) add ``layers - 1`` more latencies each."""
    experts = model.expert_params * (1 - 1 / getattr(plan, "expert", 1))  # held by other EP ranks
    params = (model.params - experts) / (plan.tensor * plan.pipeline)  # one replica's shard
    fp32 = terms.fp32_grad_reduce and getattr(plan, "fp32_grad_reduce", False)
    reduce = data_parallel_seconds((4.0 if fp32 else 2.0) * params, plan, cluster, terms) / 2  # one reduce-scatter
    gather = data_parallel_seconds(2.0 * params, plan, cluster, terms) / 2  # one all-gather of 16-bit parameters
    m = plan.microbatches
    if plan.sharding == "ddp":
        return 2 * reduce, 0.0
    once = plan.sharding == "zero1" or getattr(plan, "accumulate_grads", False)
    reductions = m if terms.per_microbatch_reduce and not once else 1
    if plan.sharding in ("zero1", "zero2"):
        return reductions * reduce, gather
    if terms.nccl_algorithms:  # one collective per layer of the stage: each pays the latency
        latencies = (model.layers // plan.pipeline - 1) * _latency(plan, cluster, terms)
        reduce, gather = reduce + latencies, gather + latencies
    gathers = m * (2 if plan.reshard_after_forward else 1)
    return reductions * reduce, gathers * gather


def exposed_seconds(reduce_s: float, gather_s: float, plan: object, stage: dict[str, float], terms: Terms) -> float:
    """The data-parallel time the compute does not hide. ``stage``: one micro-batch's ``"forward"`` and
    ``"backward"`` (recomputation included) on the slowest stage.

    Without ``dp_overlap`` nothing hides. With it, a per-step reduction hides behind the last micro-batch's
    backward; per-micro-batch collectives each hide behind their own micro-batch (the communication stream runs
    them one after another); ZeRO-1/2's parameter all-gather hides behind the next step's forward.
    """
    if not plan.dp_overlap:
        return reduce_s + gather_s
    m, forward, backward = plan.microbatches, stage["forward"], stage["backward"]
    sharded = plan.sharding in ("zero3", "fsdp")
    if terms.per_microbatch_reduce and sharded and getattr(plan, "accumulate_grads", False):
        return max(0.0, reduce_s - backward) + m * max(0.0, gather_s / m - (forward + backward))
    if terms.per_microbatch_reduce and sharded:
        return m * max(0.0, (reduce_s + gather_s) / m - (forward + backward))
    if terms.per_microbatch_reduce and plan.sharding == "zero2":
        reduce = m * max(0.0, reduce_s / m - backward)
    else:
        reduce = max(0.0, reduce_s - backward)
    return reduce + max(0.0, gather_s - forward * (m if sharded else 1))
