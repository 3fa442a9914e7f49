"""Lab "estimate": the student estimates a plan's memory per GPU and its tensor-parallel all-reduce time by hand.

The student's ``labs/estimate_plan.py`` (stub: ``grader/labs/estimate/stub.py``, taught in
``notebooks/05c_performance_model.ipynb``) defines ``model_states_bytes(params, tensor_parallel, data_parallel,
zero_stage)`` and ``tp_allreduce_seconds(seq_len, micro_batch, hidden, tensor_parallel, alpha_s, bytes_per_s)``,
and sets ``STUDENT_ID``. The numbers they are called with are the student's own variant (``LAB.variant``, drawn
from their id by :mod:`grader.labs.variant` as every lab's is), so a number copied from someone else's notebook
answers another question.
:func:`check_on_rank` (one rank: nothing here is distributed) compares them with ``course.perf``:

* ``memory``: the model states one GPU holds under mixed-precision Adam, at ZeRO stages 0 to 3, equal the second
  number of ``course.perf.planner.memory_per_gpu`` (16 bytes per parameter, 1/t of every layer, sharded by the
  stage over the data-parallel GPUs);
* ``tp_allreduce``: one layer's forward spends in its two tensor-parallel all-reduces the seconds
  ``course.perf.comm.allreduce_seconds`` gives for a ring of ``tensor_parallel`` GPUs on one node.

A miss is explained from the ratio of the two numbers (the optimizer state left out, the all-reduce counted 1x
instead of 2(n-1)/n, one all-reduce instead of two), never by printing the expected number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course.perf import catalog, comm, parallel, planner
from grader.labs import variant
from grader.labs.core import NOT_ATTEMPTED, Check, Finding, Lab, load_entry

ENTRIES = ("model_states_bytes", "tp_allreduce_seconds")
#: Relative difference accepted (the same formula in another order differs by ~1e-16).
TOLERANCE = 1e-6
#: Not to be used by the student: they hold the answers.
SHORTCUTS = ("course.perf.planner:memory_per_gpu", "course.memory.budget:model_states",
             "course.memory.budget:bytes_per_parameter", "course.perf.comm:allreduce_seconds",
             "course.collectives.cost_model:predict")
#: Catalog links a variant's node may have (one per variant).
LINKS = ("NVSwitch (A100, NVLink 3)", "NVSwitch (H100, NVLink 4)", "NVLink 2 (V100, 6 links)", "PCIe 4.0 x16")
#: The numbers a variant draws from (grader.labs.variant); the first of each is the published problem's.
#: t=2 is left out: there a ring all-reduce sends 2(n-1)/n = 1 times its bytes, so counting them once is not wrong.
CHOICES = {"layers": (24, 32, 40, 48, 64, 80), "hidden": (2048, 2560, 3072, 4096, 5120, 6144, 8192),
           "seq_len": (2048, 1024, 4096), "micro_batch": (1, 2, 4, 8), "tensor_parallel": (4, 8),
           "data_parallel": (4, 2, 8, 16, 32, 64), "link": LINKS}

CHECKS = (
    Check("memory", "model states per GPU at ZeRO stages 0-3 equal course.perf's", 5),
    Check("tp_allreduce", "seconds of one layer's tensor-parallel all-reduces equal course.perf's", 5),
)


@dataclass(frozen=True)
class Problem:
    """One student's numbers: a GPT-style transformer on ``tensor_parallel x data_parallel`` GPUs of one kind."""

    model: parallel.Transformer
    micro_batch: int  # sequences per micro-batch
    tensor_parallel: int
    data_parallel: int
    link: str  # the catalog name of the link between the GPUs of a node


def problem(config: dict) -> Problem:
    """The problem a run's ``config`` states (its variant's layers, hidden size, ..., link)."""
    hidden = config["hidden"]
    model = parallel.Transformer(f"{config['layers']} layers, hidden {hidden}", layers=config["layers"],
                                 hidden=hidden, heads=hidden // 128, seq=config["seq_len"])
    return Problem(model, config["micro_batch"], config["tensor_parallel"], config["data_parallel"], config["link"])


def reference_states(p: Problem, zero_stage: int) -> float:
    """Model-state bytes per GPU, from ``course.perf.planner.memory_per_gpu``."""
    plan = parallel.Plan(tensor=p.tensor_parallel, data=p.data_parallel, microbatch=p.micro_batch)
    return planner.memory_per_gpu(p.model, plan, zero_stage)[1]


def cluster(p: Problem) -> comm.Cluster:
    """One node of 8 GPUs joined by the variant's link (the GPU does not enter the all-reduce's time)."""
    return comm.Cluster(catalog.gpu("A100 SXM4 80GB"), catalog.link(p.link), 8)


def reference_tp_seconds(p: Problem) -> float:
    """Seconds of one layer's forward in tensor-parallel all-reduces: two rings of ``2·s·b·h`` bytes."""
    nbytes = 2.0 * p.model.seq * p.micro_batch * p.model.hidden
    return 2 * comm.allreduce_seconds(nbytes, p.tensor_parallel, cluster(p), "ring")


def _close(got: float, expected: float) -> bool:
    return math.isfinite(got) and abs(got - expected) <= TOLERANCE * abs(expected)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.4g} GB"


# -- verdicts -------------------------------------------------------------------------------------------------
def judge_memory(got: dict[int, float], p: Problem) -> Finding:
    """Finding for ``memory``: the student's bytes per GPU at each ZeRO stage against course.perf's."""
    params, t, d = p.model.params, p.tensor_parallel, p.data_parallel
    for stage in sorted(got):
        expected = reference_states(p, stage)
        if _close(got[stage], expected):
            continue
        start = (f"at ZeRO stage {stage} (Ψ = {params:,.0f} parameters, t={t}, d={d}) your model_states_bytes "
                 f"is {_gb(got[stage])}")
        shards = [d if stage >= k else 1 for k in (3, 2, 1)]  # parameters, gradients, optimizer state
        per_gpu = params / t
        missing = (expected - got[stage]) / per_gpu * shards[2]
        if abs(missing - 12) < 1e-6:
            why = ("12 bytes per parameter short: the optimizer state is missing. Mixed-precision Adam keeps an "
                   "fp32 master copy, momentum and variance (4 + 4 + 4 bytes) beside the 16-bit parameter and "
                   "gradient (2 + 2)")
        elif _close(got[stage] * t, expected):
            why = "t times too small or large: with tensor parallelism each GPU holds 1/t of every layer, once"
        elif _close(got[stage], 16 * per_gpu):
            why = (f"that is every state replicated, as at stage 0: stage {stage} shards "
                   + ("the optimizer state" if stage == 1 else "the optimizer state and the gradients"
                      if stage == 2 else "the parameters, gradients and optimizer state")
                   + f" over the d={d} data-parallel GPUs")
        else:
            why = (f"{got[stage] / per_gpu:.3g} bytes per parameter of this GPU's 1/t; count 2 (16-bit parameter) "
                   "+ 2 (gradient) + 12 (fp32 master copy, momentum, variance), each divided by d where the "
                   "stage shards it")
        return Finding("memory", False, f"{start}: {why}")
    return Finding("memory", True)


def judge_tp(got: float, p: Problem) -> Finding:
    """Finding for ``tp_allreduce``: the student's seconds against two ring all-reduces of ``2·s·b·h`` bytes."""
    expected = reference_tp_seconds(p)
    if _close(got, expected):
        return Finding("tp_allreduce", True)
    t = p.tensor_parallel
    link = comm.alpha_beta(catalog.link(p.link))
    nbytes = 2.0 * p.model.seq * p.micro_batch * p.model.hidden
    once = 2 * (2 * (t - 1) * link.alpha_s + nbytes * link.beta_s_per_byte)
    start = f"with t={t}, {nbytes:,.0f} bytes of activations, your tp_allreduce_seconds is {got:.4g} s"
    if _close(got, once):
        why = (f"that counts each all-reduce's bytes once (N / bandwidth); a ring all-reduce sends 2(n-1)/n x N "
               f"= {2 * (t - 1) / t:g} x N bytes per GPU (a reduce-scatter, then an all-gather)")
    elif _close(got, expected / 2):
        why = "half of it: a layer's forward runs two all-reduces (after attention, after the MLP)"
    elif _close(got, expected - 2 * 2 * (t - 1) * link.alpha_s):
        why = "the latency is missing: a ring all-reduce takes 2(n-1) steps, each costing alpha_s"
    elif _close(got, expected + 2 * 2 * (t - 1) / t * nbytes * link.beta_s_per_byte):
        why = "4 bytes per value counted: the activations are 16-bit, 2 bytes each"
    else:
        why = (f"{got / expected:.3g}x course.perf's; one ring all-reduce of N bytes on n GPUs takes "
               "2(n-1) x alpha_s + 2(n-1)/n x N / bytes_per_s, and a layer's forward runs two")
    return Finding("tp_allreduce", False, f"{start}: {why}")


# -- on the rank -------------------------------------------------------------------------------------------------
def student_problem(student_id: str) -> Problem:
    """The problem ``student_id`` is checked on (the published one for an empty id)."""
    return problem(variant.variant_runs(LAB, student_id)[0])


def _run_problem(config: dict) -> Problem:
    """The student's problem, or in a hidden run (a seed) the problem of an id nobody has."""
    if config.get("seed") is not None:
        config = {**config, **variant.draw("estimate", f"hidden variant {config['seed']}", CHOICES)}
    return problem(config)


def check_on_rank(path: str, config: dict) -> list[Finding]:
    """Call the student's two functions on their variant (or a hidden one) and judge them against course.perf."""
    states, seconds = (load_entry(path, entry) for entry in ENTRIES)
    p = _run_problem(config)
    link = comm.alpha_beta(catalog.link(p.link))
    findings = []
    try:
        got_states = {stage: float(states(p.model.params, p.tensor_parallel, p.data_parallel, stage))
                      for stage in range(4)}
        findings.append(judge_memory(got_states, p))
    except NotImplementedError:  # one function written, not yet the other: judge the one
        findings.append(Finding("memory", False, NOT_ATTEMPTED.format(entry=ENTRIES[0], path=path)))
    try:
        got_seconds = float(seconds(p.model.seq, p.micro_batch, p.model.hidden, p.tensor_parallel, link.alpha_s,
                                    1.0 / link.beta_s_per_byte))
        findings.append(judge_tp(got_seconds, p))
    except NotImplementedError:
        findings.append(Finding("tp_allreduce", False, NOT_ATTEMPTED.format(entry=ENTRIES[1], path=path)))
    return findings


LAB = Lab(
    name="estimate", title="estimate a plan: model states per GPU and tensor-parallel all-reduce time",
    notebook="05c_performance_model", student_file="labs/estimate_plan.py", entry="model_states_bytes",
    checks=CHECKS, rank_check=check_on_rank, shortcuts=SHORTCUTS,
    runs=({"world_size": 1, "timeout_s": 60, **{key: values[0] for key, values in CHOICES.items()}},),
    variant=CHOICES,
    hidden_runs=({"world_size": 1, "seed": "jitter", "timeout_s": 60, "label": "another variant"},
                 {"world_size": 1, "seed": "jitter", "timeout_s": 60, "label": "another variant"}),
)
