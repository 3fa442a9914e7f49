"""Which split does the performance model pick? Every tensor x pipeline x data split of a GPT model, the fastest
that fits, under the model's assumptions.

For every ``t x p x d = N`` (``t`` dividing the heads, inside a node or across nodes, ``p`` dividing the layers,
``d`` dividing the global batch) :func:`splits` asks the course's performance model for one step
(:func:`course.perf.parallel.step_time`: compute, tensor-parallel all-reduces, the pipeline bubble, the
data-parallel all-reduce), with the interleaved schedule where it pays. The tensor-parallel all-reduces are not
overlapped with compute (Megatron-LM's default; ``Plan(tp_overlap=True)`` models the overlap).
:func:`course.perf.planner.memory_per_gpu` adds up what one GPU of the first stage holds: model states of its
``1/(t·p)`` of the parameters (:mod:`course.memory.budget`: mixed-precision Adam, ZeRO-1 over the ``d``
data-parallel ranks) and, with recomputation, every layer's 16-bit input for the ``p`` micro-batches 1F1B keeps
in flight there (``1 + (p-1)/(p·v)`` times more with ``v`` interleaved chunks), one layer's working set and the
logits (Korthikanti et al. 2022, section 4.2.3, for the ``p`` in flight). :func:`choose` keeps the splits that
fit the GPU's memory and picks the fastest. Everything here is modelled: nothing ran on those GPUs. The pick is
the model's answer under its assumptions (ZeRO-1 for every ``d·c > 1``, no sequence parallelism, a fixed
global batch, fitted kernel efficiencies), not what a team would run: they also weigh what it leaves out (failures
and checkpoints, other jobs on the network, a framework's kernels, the time to tune).

Two more splits are there to choose when asked (``contexts``, ``experts``; both ``(1,)`` by default, as 08's
table): context parallelism ``c`` (the sequence split over ``c`` GPUs, activations divided by ``c``, a ring of
keys and values per layer) and, for a mixture of experts, expert parallelism ``e`` (the experts split over ``e``
of the ``d·c`` GPUs, their weights divided by ``e``, an all-to-all per MoE layer; over the network once ``t·c·e``
passes a node). Notebook 08b asks for them.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.perf import parallel, planner
from course.perf.comm import Cluster

#: GPT-3's shapes (Brown et al. 2020, Table 2.1: n_layers, d_model, n_heads): XL (1.3B), 13B and 175B parameters.
#: The table gives XL 24 heads of d_head 128, which is 3072 wide, not its d_model of 2048; the heads are the table's.
GPT = [parallel.Transformer("GPT 1.3B", 24, 2048, 24), parallel.Transformer("GPT 13B", 40, 5120, 40),
       parallel.Transformer("GPT 175B", 96, 12288, 96)]
GPT_SOURCE = "https://arxiv.org/abs/2005.14165"


@dataclass(frozen=True)
class Split:
    """One way to split the model: the plan, its modelled step, the bytes one GPU holds, and whether they fit."""

    plan: parallel.Plan
    step: parallel.TransformerStep
    memory_bytes: float
    fits: bool

    @property
    def name(self) -> str:
        """``t x p x d``, with ``CP c`` and ``EP e`` after it where used."""
        extra = "".join(f" {label}{n}" for label, n in (("CP", self.plan.context), ("EP", self.plan.expert)) if n > 1)
        return f"{self.plan.tensor} x {self.plan.pipeline} x {self.plan.data}{extra}"


def evaluate(model: parallel.Transformer, tensor: int, pipeline: int, data: int, cluster: Cluster,
             global_batch: int = 512, context: int = 1, expert: int = 1) -> Split:
    """The modelled step and memory of one ``tensor x context x pipeline x data`` split (ZeRO-1 when ``d·c > 1``),
    ``expert`` of the ``d·c`` GPUs splitting the experts, with the interleaved schedule where it pays
    (:func:`course.perf.planner.interleaved`)."""
    sharded = data * context > 1
    plan = parallel.Plan(tensor, pipeline, data, global_batch, 1, "zero1" if sharded else "ddp", context=context,
                         expert=expert)
    plan = planner.interleaved(model, plan, cluster)
    memory, _ = planner.memory_per_gpu(model, plan, 1 if sharded else 0)
    return Split(plan, parallel.step_time(model, plan, cluster), memory, memory <= cluster.gpu.memory_bytes)


def splits(model: parallel.Transformer, gpus: int, cluster: Cluster, global_batch: int = 512,
           contexts: tuple[int, ...] = (1,), experts: tuple[int, ...] = (1,)) -> list[Split]:
    """Every split of ``gpus`` GPUs the model can run (see the module docstring), with each context-parallel size
    of ``contexts`` that divides the sequence and each expert-parallel size of ``experts`` that divides the
    experts and the ``d·c`` GPUs."""
    found = []
    for t in range(1, gpus + 1):  # across nodes too: the model prices it on the network
        if gpus % t or model.heads % t:
            continue
        for c in contexts:
            if (gpus // t) % c or model.seq % c:
                continue
            for p in range(1, gpus // (t * c) + 1):
                d = gpus // (t * c * p)
                if (gpus // (t * c)) % p or model.layers % p or global_batch % d:
                    continue
                for e in experts:
                    if e == 1 or (model.moe and model.experts % e == 0 and (d * c) % e == 0):
                        found.append(evaluate(model, t, p, d, cluster, global_batch, c, e))
    return found


def choose(model: parallel.Transformer, gpus: int, cluster: Cluster, global_batch: int = 512,
           contexts: tuple[int, ...] = (1,), experts: tuple[int, ...] = (1,)) -> Split | None:
    """The fastest split that fits the GPU's memory, or None when none fits (:func:`splits` for the sizes)."""
    fitting = [split for split in splits(model, gpus, cluster, global_batch, contexts, experts) if split.fits]
    return min(fitting, key=lambda split: split.step.step_s) if fitting else None


def table(models: list[parallel.Transformer], gpus: int, cluster: Cluster, global_batch: int = 512) -> list[dict]:
    """One row per model: its size, the bytes data parallelism needs per GPU, and the split the model picks.

    Two data-parallel columns, because they answer different questions: ``ddp_gb`` replicates every model
    state (plain DDP), ``zero1_gb`` shards Adam's state over all ``gpus`` ranks (DP + ZeRO-1). A model can fit
    under the second and not the first: then data parallelism alone works only thanks to ZeRO-1.
    """
    rows = []
    for model in models:
        everywhere = parallel.Plan(1, 1, gpus, max(global_batch, gpus), 1)
        best = choose(model, gpus, cluster, global_batch)
        rows.append({"model": model.name, "parameters_b": round(model.params / 1e9, 1),
                     "ddp_gb": round(planner.memory_per_gpu(model, everywhere, 0)[0] / 1e9, 1),
                     "zero1_gb": round(planner.memory_per_gpu(model, everywhere, 1)[0] / 1e9, 1),
                     "pick": best.name if best else "none fits",
                     "gb": round(best.memory_bytes / 1e9, 1) if best else None,
                     "step_s": round(best.step.step_s, 2) if best else None,
                     "bubble_percent": round(100 * best.step.bubble_s / best.step.step_s, 1) if best else None})
    return rows


#: What each column of :func:`table` means, in the order printed by :func:`format_table`.
COLUMNS = {"model": "model", "parameters_b": "parameters (billions)",
           "ddp_gb": "GB per GPU, plain DDP (every state replicated)",
           "zero1_gb": "GB per GPU, DP + ZeRO-1 (Adam's state sharded)",
           "pick": "the fastest split that fits, tensor x pipeline x data",
           "gb": "its GB per GPU", "step_s": "its step (s)", "bubble_percent": "its bubble (% of the step)"}


def format_table(rows: list[dict]) -> str:
    """:func:`table`'s rows as text: a legend of numbered columns, then one line per model."""
    legend = [f"({i}) {label}" for i, label in enumerate(COLUMNS.values(), start=1)]
    header = f"{'(1)':<10}" + "".join(f"{f'({i})':>12}" for i in range(2, len(COLUMNS) + 1))
    lines = [f"{str(row['model']):<10}" + "".join(f"{str(row[key]):>12}" for key in list(COLUMNS)[1:])
             for row in rows]
    return "\n".join(legend + ["", header, *lines])
