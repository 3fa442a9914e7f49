"""Which split would a cluster pick? Tensor x pipeline x data parallelism for a GPT-sized model, modelled.

For every ``t x p x d = N`` (``t`` at most one node's GPUs, ``p`` dividing the layers) :func:`estimate` adds up
one training step on the course's hardware catalog and performance-model assumptions
(``course.perf.model.Assumptions``, ``course.collectives.cost_model``), nothing measured:

* compute: ``6·Φ·B·s`` FLOPs (forward + backward, Narayanan et al. 2021 eq. 3 without recomputation) over ``N`` GPUs
  at ``compute_efficiency`` of their 16-bit peak;
* the pipeline bubble: ``(p-1)/(m+p-1)`` of the step idle, ``m = B/(d·b)`` micro-batches of ``b`` sequences;
* tensor parallelism: 4 all-reduces of ``b·s·h`` 16-bit activations per layer and micro-batch (the count the
  course measures in ``tensor_parallel``) on ``t`` ranks over NVLink (over the network if ``t`` spans nodes);
* data parallelism: one all-reduce of this rank's 16-bit gradients, ``2Φ/(t·p)`` bytes, on ``d`` ranks over the
  network when the step spans nodes, hidden behind the backward pass (2/3 of the compute) as far as it lasts
  (``Assumptions.overlap``);
* memory: model states from ``course.memory.budget`` (Adam, bf16 with fp32 master weights, ZeRO-1 over ``d``), and
  activations of tensor + sequence parallelism, ``s·b·h·L·(34/t + 5·a·s/(h·t))`` bytes on the first stage, which
  holds ``p`` micro-batches of ``L/p`` layers under 1F1B (Korthikanti et al. 2022, Table 2 and section 4.2.3).

:func:`choose` keeps the plans that fit the GPU's memory and picks the fastest. Tensor- and pipeline-parallel
communication never overlaps compute here, so those times are upper bounds.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.collectives import cost_model
from course.memory.budget import Setup, model_states
from course.perf.model import Assumptions, Cluster, alpha_beta

KORTHIKANTI = "https://arxiv.org/abs/2205.05198"  # activation bytes per layer, Table 2
NARAYANAN = "https://arxiv.org/abs/2104.04473"  # 6·Φ·B·s FLOPs per step and the 1F1B bubble
MIXED = Assumptions(precision="fp16")  # 16-bit tensor-core compute, the course's other assumptions as they are


@dataclass(frozen=True)
class Model:
    """A GPT-style model: ``num_layers`` blocks of width ``d_model``; ``12·L·h²`` parameters in the blocks."""

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    seq_len: int = 2048

    @property
    def params(self) -> float:
        return 12 * self.num_layers * self.d_model**2


@dataclass(frozen=True)
class Plan:
    """One way to split the model over ``t·p·d`` GPUs, with its modelled step (seconds) and memory (bytes)."""

    tp: int
    pp: int
    dp: int
    seconds: dict[str, float]  # "compute", "bubble", "tensor parallel", "data parallel"
    memory_bytes: float
    fits: bool

    @property
    def step_s(self) -> float:
        return sum(self.seconds.values())


def estimate(model: Model, tp: int, pp: int, dp: int, global_batch: int, cluster: Cluster,
             a: Assumptions = MIXED, micro_batch: int = 1) -> Plan:
    """The modelled step and memory of one ``tp x pp x dp`` split (module docstring)."""
    gpus, s, h = tp * pp * dp, model.seq_len, model.d_model
    m = max(global_batch // (dp * micro_batch), 1)
    compute = 6 * model.params * global_batch * s / (gpus * cluster.gpu.peak_flops(a.precision) * a.compute_efficiency)
    fast = cluster.intra if tp <= cluster.gpus_per_node else cluster.inter
    tensor = 4 * model.num_layers // pp * m * float(
        cost_model.predict("ring", micro_batch * s * h * 2, tp, alpha_beta(fast, a))) if tp > 1 else 0.0
    spans_nodes = gpus > cluster.gpus_per_node
    slow = cluster.inter if spans_nodes and cluster.inter else cluster.intra
    data = float(cost_model.predict("ring", 2 * model.params / (tp * pp), dp, alpha_beta(slow, a))) if dp > 1 else 0.0
    if a.overlap:  # DDP-style buckets: the all-reduce hides behind the backward pass (2/3 of the compute)
        data = max(0.0, data - 2 / 3 * compute)
    busy = compute + tensor
    seconds = {"compute": compute, "bubble": busy * (pp - 1) / m, "tensor parallel": tensor, "data parallel": data}
    states = model_states(model.params / (tp * pp), Setup("adam", "bf16", zero_stage=1 if dp > 1 else 0,
                                                           world_size=dp)).total
    activations = s * micro_batch * h * model.num_layers * (34 / tp + 5 * model.num_heads * s / (h * tp))
    memory = states + activations
    return Plan(tp, pp, dp, seconds, memory, memory <= cluster.gpu.memory_bytes)


def plans(model: Model, num_gpus: int, global_batch: int, cluster: Cluster) -> list[Plan]:
    """Every split of ``num_gpus`` with ``t`` dividing the heads (at most a node) and ``p`` dividing the layers."""
    found = []
    for tp in (t for t in range(1, cluster.gpus_per_node + 1) if num_gpus % t == 0 and model.num_heads % t == 0):
        for pp in (p for p in range(1, num_gpus // tp + 1) if (num_gpus // tp) % p == 0 and model.num_layers % p == 0):
            found.append(estimate(model, tp, pp, num_gpus // (tp * pp), global_batch, cluster))
    return found


def choose(model: Model, num_gpus: int, global_batch: int, cluster: Cluster) -> Plan | None:
    """The fastest split that fits the GPU's memory, or None when none fits."""
    fitting = [plan for plan in plans(model, num_gpus, global_batch, cluster) if plan.fits]
    return min(fitting, key=lambda plan: plan.step_s) if fitting else None


def table(models: list[Model], num_gpus: int, global_batch: int, cluster: Cluster) -> list[dict]:
    """One row per model: its size, what pure data parallelism would need, and the split :func:`choose` picks."""
    rows = []
    for model in models:
        pure = estimate(model, 1, 1, num_gpus, global_batch, cluster)
        best = choose(model, num_gpus, global_batch, cluster)
        rows.append({"model": model.name, "parameters (B)": round(model.params / 1e9, 1),
                     "pure DP GB/GPU": round(pure.memory_bytes / 1e9, 1),
                     "pick t x p x d": f"{best.tp} x {best.pp} x {best.dp}" if best else "none fits",
                     "GB/GPU": round(best.memory_bytes / 1e9, 1) if best else None,
                     "step s": round(best.step_s, 2) if best else None,
                     "bubble %": round(100 * best.seconds["bubble"] / best.step_s, 1) if best else None})
    return rows


GPT = [Model("GPT 1.3B", 24, 2048, 16), Model("GPT 13B", 40, 5120, 40), Model("GPT 175B", 96, 12288, 96)]
