"""A small planner: for a transformer and a cluster, which of DDP, ZeRO-2, FSDP and TP x FSDP fit in memory,
and what step time each would take. Every number is **modelled**.

Memory per GPU = model states (:mod:`course.memory.budget`: mixed-precision Adam, 16 bytes per parameter,
sharded by the ZeRO stage over the data-parallel ranks; with tensor parallelism each GPU holds 1/t of every
layer first) + activations with full recomputation: every layer's 16-bit input (``2·s·b·h`` bytes), one layer's
working set while it is recomputed (``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` bytes, Korthikanti et al. 2022, without the
``5·a·s/(h·t)`` of the attention scores when a fused attention kernel never stores them) and the
logits in FP32 for the loss (``4·s·b·V/t``). Step time = :func:`course.perf.parallel.step_time`.

Context parallelism (``plan.context = c``) gives each GPU ``s/c`` of every sequence: every activation term above
shrinks by ``c`` (each query row still meets all ``s`` keys, so the unfused scores keep their ``s``), and Adam's
state is sharded over the ``d·c`` GPUs that hold the same weights. Expert parallelism (``plan.expert = e``) gives
each GPU ``1/e`` of the routed experts' weights (sharded by ZeRO over the ``d·c/e`` GPUs that hold the same ones),
and the MLP's working set grows with the ``top_k`` copies of each token. Taught in
``notebooks/05c_performance_model.ipynb``; CP and EP in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course.memory import budget as memory_budget
from course.perf import parallel
from course.perf.comm import Cluster

STRATEGIES = ("DDP", "ZeRO-2", "FSDP", "TP x FSDP")


@dataclass(frozen=True)
class Option:
    """One strategy for one model on one cluster: its plan, its memory per GPU, whether it fits, its step."""

    strategy: str
    plan: parallel.Plan
    memory_bytes: float
    states_bytes: float
    fits: bool
    step_s: float
    tokens_per_s: float


def _plan(strategy: str, gpus: int, cluster: Cluster, global_batch: int) -> tuple[parallel.Plan, int]:
    """The plan and the ZeRO stage of ``strategy`` on ``gpus`` GPUs."""
    t = cluster.gpus_per_node if strategy == "TP x FSDP" else 1
    sharding, stage = {"DDP": ("ddp", 0), "ZeRO-2": ("zero2", 2), "FSDP": ("fsdp", 3),
                       "TP x FSDP": ("fsdp", 3)}[strategy]
    return parallel.Plan(t, 1, gpus // t, global_batch, 1, sharding), stage


def interleaved(model: parallel.Transformer, plan: parallel.Plan, cluster: Cluster) -> parallel.Plan:
    """``plan`` with the number of model chunks per GPU (``interleave``) that makes the step fastest: 1 (plain
    1F1B) or any ``v`` that splits every stage's layers and runs the microbatches in whole groups of the stages.
    More chunks divide the bubble by ``v`` but multiply the pipeline's sends by ``v``; the planner keeps ``v``
    only where that pays."""
    per_stage = model.layers // plan.pipeline
    if plan.pipeline == 1 or plan.stage_layers or plan.microbatches % plan.pipeline:
        return plan
    candidates = [replace(plan, interleave=v) for v in range(1, per_stage + 1) if per_stage % v == 0]
    return min(candidates, key=lambda p: parallel.step_time(model, p, cluster).step_s)


def memory_per_gpu(model: parallel.Transformer, plan: parallel.Plan, zero_stage: int) -> tuple[float, float]:
    """``(total, model states)`` bytes one GPU of the first pipeline stage holds under ``plan`` (module docstring).

    With a pipeline of ``p`` stages the GPU holds ``1/(t·p)`` of the parameters, and 1F1B keeps up to ``p``
    micro-batches' layer inputs in flight on the first stage (``1 + (p-1)/(p·v)`` times more with ``v``
    interleaved chunks; Korthikanti et al. 2022, section 4.2.3). The one formula: the planner here and
    :mod:`course.model_parallel.plan` both use it.
    """
    states = _states(model, plan, zero_stage)
    s, b, h, t = model.seq, plan.microbatch, model.hidden, plan.tensor
    rows = s / plan.context  # this GPU's tokens of each sequence
    layer_inputs = 2 * rows * b * h * model.layers / plan.pipeline * min(plan.pipeline, plan.microbatches)
    if plan.interleave > 1:  # the first stage runs ahead by (p-1)/(p·v) more (Korthikanti et al. 2022, 4.2.3)
        layer_inputs *= 1 + (plan.pipeline - 1) / (plan.pipeline * plan.interleave)
    scores = 0.0 if plan.fused_attention else 5 * model.heads * s / (h * t)  # a fused kernel keeps no s x s scores
    mlp = 24.0 if not model.moe else 8 + (6 if model.gated else 4) * model.active_ffn / h  # GPT's 4h MLP: 24
    working = rows * b * h * (10 + mlp / t + scores)
    logits = 4 * rows * b * model.vocab / t
    return states + layer_inputs + working + logits, states


def _states(model: parallel.Transformer, plan: parallel.Plan, zero_stage: int) -> float:
    """Model-state bytes on one GPU: its ``1/(t·p)`` of the dense weights sharded over the ``d·c`` GPUs holding
    them, and its ``1/(t·p·e)`` of the routed experts over the ``d·c/e`` holding those (:mod:`course.memory.budget`)."""
    split, group = plan.tensor * plan.pipeline, plan.data * plan.context
    dense = (model.params - model.expert_params) / split
    states = memory_budget.model_states(dense, memory_budget.Setup("adam", "bf16", zero_stage, group)).model_states
    if model.expert_params:
        per_gpu = model.expert_params / (split * plan.expert)
        setup = memory_budget.Setup("adam", "bf16", zero_stage, max(1, group // plan.expert))
        states += memory_budget.model_states(per_gpu, setup).model_states
    return states


def options(model: parallel.Transformer, cluster: Cluster, gpus: int, global_batch: int) -> list[Option]:
    """Every strategy of :data:`STRATEGIES` for ``model`` on ``gpus`` GPUs of ``cluster``, with its memory per
    GPU against the GPU's memory, and its modelled step time (even when it does not fit: the time it would take).

    Raises:
        ValueError: a GPU count that is not a whole number of nodes, or a batch the plans cannot split.
    """
    if gpus % cluster.gpus_per_node:
        raise ValueError(f"{gpus} GPUs is not a whole number of {cluster.gpus_per_node}-GPU nodes; "
                         "plan for whole nodes.")
    result = []
    for strategy in STRATEGIES:
        plan, stage = _plan(strategy, gpus, cluster, global_batch)
        memory, states = memory_per_gpu(model, plan, stage)
        step = parallel.step_time(model, plan, cluster)
        result.append(Option(strategy, plan, memory, states, memory <= cluster.gpu.memory_bytes, step.step_s,
                             global_batch * model.seq / step.step_s))
    return result


def best(found: list[Option]) -> Option | None:
    """The fastest option that fits, or None when none does."""
    fitting = [option for option in found if option.fits]
    return min(fitting, key=lambda option: option.step_s) if fitting else None


def format_options(found: list[Option], memory_bytes: float) -> str:
    """The options as a table: strategy, GB per GPU (model states), fits, step time, tokens/s."""
    lines = [f"{'strategy':<11} {'GB per GPU':>10} {'(states)':>9} {'fits ' + f'{memory_bytes / 1e9:.0f} GB':>10} "
             f"{'step s':>8} {'tokens/s':>10}"]
    for o in found:
        lines.append(f"{o.strategy:<11} {o.memory_bytes / 1e9:>10.1f} {o.states_bytes / 1e9:>9.1f} "
                     f"{'yes' if o.fits else 'NO':>10} {o.step_s:>8.2f} {o.tokens_per_s:>10,.0f}")
    return "\n".join(lines)
