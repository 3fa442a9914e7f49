"""Who does the work: rank 0 alone vs data parallelism, measured on the ranks and modelled for real GPUs.

Two ways to "use" n GPUs train the same model to the same parameters: rank 0 computes every whole batch and
broadcasts the result while the others wait (``"rank0"``, :func:`train_on_rank0`), or every rank computes 1/n
of each batch and the gradients are all-reduced (``"ranks"``, :func:`course.data_parallel.train_on_ranks`).
Each rank clocks, per step, its seconds of compute and of communication (waiting for the others included), so
the split of the work is measured where it happens, not guessed from CPU%.

Emulated GPUs share this machine's cores, so the *time* data parallelism saves here is bounded by the
cores (2 shared by 4 ranks), and a waiting gloo rank can still burn CPU. What four real GPUs would do is
**modelled** (:func:`modelled_step`): compute from FLOPs against an assumed GPU, communication from the
alpha-beta model of :mod:`course.collectives.cost_model`. Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course import data_parallel, train
from course.arguments import check_choice, check_count
from course.collectives import cost_model
from course.timing import Estimate, PhaseClock, summarize

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def train_on_rank0(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
                   optimizer: str = "sgd", clock: PhaseClock | None = None) -> list[float]:
    """Run inside a launched rank: the naive way to "use" several GPUs, for contrast with
    :func:`course.data_parallel.train_on_ranks`.

    Rank 0 trains on every whole global batch and broadcasts the new parameters (one flat message per step);
    the other ranks only wait for them. The result is one process's training (same losses, same parameters on
    every rank), at one process's speed: one GPU computes, the others wait (:func:`timed_training` clocks it).

    Args:
        optimizer, clock: as in :func:`course.data_parallel.train_on_ranks` (``"communicate"`` is the broadcast,
            waiting included).

    Returns:
        The global-batch losses (rank 0's, on every rank).
    """
    device = next(model.parameters()).device
    optimizer_ = train.make_optimizer(optimizer, model.parameters(), lr)
    clock = PhaseClock() if clock is None else clock
    losses = []
    for inputs, targets in batches:
        clock.new_step()
        loss = torch.zeros(1, device=device)
        if dist.get_rank() == 0:
            with clock.phase("compute"):
                loss = data_parallel.forward_backward(model, inputs, targets).reshape(1)
                optimizer_.step()
        with clock.phase("communicate"):
            flat = torch.cat([parameters_to_vector(model.parameters()).detach(), loss])  # one message per step
            dist.broadcast(flat, src=0)
            vector_to_parameters(flat[:-1], model.parameters())
        losses.append(float(flat[-1]))
    return losses


#: The two strategies, by the name :func:`timed_training` takes.
STRATEGIES = {"rank0": train_on_rank0, "ranks": data_parallel.train_on_ranks}
LABELS = {"rank0": "rank 0 alone", "ranks": "data parallelism"}


def timed_training(strategy: str, model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   lr: float, optimizer: str = "adam", warmup_steps: int = 1) -> dict[str, Any]:
    """Rank function: train with ``strategy`` and return the losses and this rank's clocked seconds per step.

    Args:
        strategy: ``"rank0"`` or ``"ranks"`` (:data:`STRATEGIES`). optimizer: ``"sgd"`` or ``"adam"``.
        warmup_steps: first steps left out of the timings (they allocate memory and connect the ranks).

    Returns:
        ``{"losses": [...], "compute_s": [...], "communicate_s": [...], "step_s": [...], "span": (start, end)}``:
        losses for every step, seconds for every step after the warm-up, and the ``time.monotonic()`` span of
        those timed steps (what a monitor reading must fall in to describe them).
    """
    run_strategy = STRATEGIES[check_choice("strategy", strategy, STRATEGIES)]
    clock = PhaseClock()
    losses = run_strategy(model, batches, lr, optimizer=optimizer, clock=clock)
    end = time.monotonic()
    kept = slice(min(warmup_steps, len(batches) - 1), None)
    return {"losses": losses, "compute_s": clock.seconds("compute")[kept],
            "communicate_s": clock.seconds("communicate")[kept], "step_s": clock.seconds()[kept],
            "span": (clock.started[kept][0], end)}


def compare_on_ranks(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
                     optimizer: str = "adam", then: tuple[Callable[..., Any], tuple] | None = None
                     ) -> dict[str, Any]:
    """Rank function: both strategies one after the other from copies of ``model``, in one launch.

    Starting ranks takes seconds, training here a fraction of one, so one launch runs both. All ranks start
    each strategy together (a barrier).

    Args:
        then: ``(rank_function, args)`` to run afterwards in the same launch (notebook 03 runs its parameter
            server there); its result is under ``"then"``.

    Returns:
        ``{"rank0": timed_training(...), "ranks": timed_training(...), "phases": {strategy: (start, end)},
        "then": ...}``, ``phases`` the ``time.monotonic()`` span of each strategy's timed steps on this rank
        (one clock for every process on the machine; the warm-up step is left out, as in the timings), so a
        :mod:`course.monitor.watch` timeline can be cut into the two runs (:func:`plot_monitor`).
    """
    results: dict[str, Any] = {"phases": {}}
    for strategy in STRATEGIES:
        dist.barrier()
        results[strategy] = timed_training(strategy, copy.deepcopy(model), batches, lr, optimizer)
        results["phases"][strategy] = results[strategy]["span"]
    if then is not None:
        function, args = then
        results["then"] = function(*args)
    return results


def watch_both(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
               world_size: int = 4, optimizer: str = "adam", interval_s: float = 0.1,
               then: tuple[Callable[..., Any], tuple] | None = None) -> tuple[list[dict[str, Any]], Any, dict]:
    """Launch :func:`compare_on_ranks` under :func:`course.monitor.watch.watch` (a reading every ``interval_s``).

    Returns:
        ``(per-rank results, monitor history, {strategy: (start_s, end_s)})``, the phases in seconds since the
        monitor started (the x axis of its timeline).
    """
    from course.monitor import watch as monitor
    from course.runtime.launch import launch

    with monitor.watch(interval_s=interval_s) as history:
        origin = time.monotonic()  # the sampler has just started: its readings' t_s count from about here
        results = launch(compare_on_ranks, world_size, model, batches, lr, optimizer, then, timeout_s=240)
    phases = {name: (a - origin, b - origin) for name, (a, b) in results[0]["phases"].items()}
    return results, history, phases


def plot_monitor(history: Any, phases: dict[str, tuple[float, float]]) -> Figure:
    """:func:`course.monitor.summary_plot.plot_timeline` with the two runs shaded and named (the rest is start-up)."""
    from course.monitor import summary_plot

    fig = summary_plot.plot_timeline(history)
    for ax in fig.axes:
        for color, (name, (start, end)) in zip(("tab:red", "tab:blue"), phases.items(), strict=True):
            ax.axvspan(start, end, color=color, alpha=0.15, label=LABELS[name])
    fig.axes[0].legend(fontsize=7, loc="upper left")
    return fig


def cpu_while_training(history: Any, phases: dict[str, tuple[float, float]]) -> dict[str, list[float]]:
    """Mean CPU% (or GPU%) of each device over each run's phase: ``{strategy: [device 0, device 1, ...]}``.

    A phase shorter than the monitor's interval may hold no reading: its values are NaN then.
    """
    means = {}
    for name, (start, end) in phases.items():
        values = []
        for device in history.devices():
            inside = [r.utilization for r in history.of(device) if start < r.t_s <= end]
            values.append(sum(inside) / len(inside) if inside else math.nan)
        means[name] = values
    return means


def describe_waiting_cpu(cpu: dict[str, list[float]]) -> str:
    """What the monitor says about the ranks that wait while rank 0 works alone, read against their clocks.

    Args:
        cpu: :func:`cpu_while_training`'s means; ``cpu["rank0"][0]`` is the working rank, the rest wait.
    """
    if len(cpu.get("rank0", ())) < 2:
        return "The monitor found fewer than two ranks while rank 0 worked alone: no verdict."
    worker, idle = cpu["rank0"][0], cpu["rank0"][1:]
    if any(math.isnan(v) for v in [worker, *idle]):
        return "The monitor took no reading during part of the run (a phase shorter than its interval): no verdict."
    if max(idle) >= 0.5 * worker:
        return ("The waiting ranks use CPU too, though their clocks show they compute nothing: on emulated GPUs "
                "CPU% cannot tell waiting from working; the clocks can.")
    return "The waiting ranks use little CPU, as their clocks say: they spend the step waiting in the broadcast."


@dataclass(frozen=True)
class RankShare:
    """One rank's measured step: medians (with intervals) of its seconds per step."""

    rank: int
    step: Estimate
    compute: Estimate
    step_samples: tuple[float, ...]

    @property
    def compute_fraction(self) -> float:
        """Median compute seconds over median step seconds: the share of the step this rank worked."""
        return self.compute.median / self.step.median if self.step.median else 0.0


def shares(per_rank: Sequence[dict[str, Any]]) -> list[RankShare]:
    """Each rank's median step and compute time from :func:`timed_training`'s per-rank results."""
    return [RankShare(rank, summarize(r["step_s"]), summarize(r["compute_s"]), tuple(r["step_s"]))
            for rank, r in enumerate(per_rank)]


@dataclass(frozen=True)
class ModelledDevice:
    """One GPU's modelled step, in seconds: compute, communication, and idle (waiting) until the step ends."""

    compute_s: float
    communicate_s: float
    idle_s: float


def modelled_step(strategy: str, world_size: int, global_batch_size: int, flops_per_sample: float,
                  parameter_bytes: float, flop_rate: float, link: cost_model.AlphaBeta) -> list[ModelledDevice]:
    """Modelled seconds of one training step on each of ``world_size`` real GPUs (assumed, not measured).

    compute = 3 x FLOPs per sample x samples / ``flop_rate`` (forward + backward; ``flop_rate`` is a GPU's peak
    times an assumed efficiency, e.g. ``gpu.peak_flops("fp32") * perf_model.Assumptions().compute_efficiency``
    from :mod:`course.perf.catalog`). ``"rank0"``: GPU 0 computes the whole batch, then a binomial-tree broadcast sends
    the parameters (⌈log2 n⌉ steps of α + P·β over ``link``, half a tree allreduce); the others idle while GPU 0
    computes. ``"ranks"``: every GPU computes 1/n of the batch, then a ring allreduce of the gradients.

    Raises:
        ValueError: unknown strategy; world size, batch, sizes or rate not positive.
    """
    check_choice("strategy", strategy, STRATEGIES)
    n, batch = check_count("world_size", world_size), check_count("global_batch_size", global_batch_size)
    if flops_per_sample <= 0 or parameter_bytes <= 0 or flop_rate <= 0:
        raise ValueError(f"flops_per_sample, parameter_bytes and flop_rate must be positive, got "
                         f"{flops_per_sample!r}, {parameter_bytes!r} and {flop_rate!r}.")
    rate = flop_rate
    if strategy == "rank0":
        compute = 3 * flops_per_sample * batch / rate
        depth = math.ceil(math.log2(n)) if n > 1 else 0
        broadcast = depth * (link.alpha_s + parameter_bytes * link.beta_s_per_byte)
        return [ModelledDevice(compute, broadcast, 0.0)] + [ModelledDevice(0.0, broadcast, compute)] * (n - 1)
    compute = 3 * flops_per_sample * batch / n / rate
    allreduce = float(cost_model.predict("ring", parameter_bytes, n, link)) if n > 1 else 0.0
    return [ModelledDevice(compute, allreduce, 0.0)] * n


def plot(measured: dict[str, list[RankShare]], modelled: dict[str, list[ModelledDevice]],
         modelled_title: str) -> Figure:
    """Per strategy (rows): each device's step split into compute / communicate-or-wait / idle, measured on
    the emulated ranks (left, medians) and modelled for real GPUs (right), each as a share of the step."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(measured), 2, figsize=(11, 1.2 + 1.5 * len(measured)), squeeze=False)
    for row, strategy in enumerate(measured):
        bars = {"measured": [(s.compute.median, s.step.median - s.compute.median, 0.0) for s in measured[strategy]],
                "modelled": [(d.compute_s, d.communicate_s, d.idle_s) for d in modelled[strategy]]}
        for col, (kind, parts) in enumerate(bars.items()):
            ax, step = axes[row, col], max(sum(p) for p in parts)
            left = [0.0] * len(parts)
            for i, (name, color) in enumerate((("compute", "tab:green"), ("communicate / wait", "tab:orange"),
                                               ("idle", "0.85"))):
                widths = [p[i] / step for p in parts]
                ax.barh(range(len(parts)), widths, left=left, color=color, label=name)
                left = [a + b for a, b in zip(left, widths, strict=True)]
            ax.set(yticks=range(len(parts)), yticklabels=[f"GPU {d}" for d in range(len(parts))], xlim=(0, 1))
            ax.invert_yaxis()
            if kind == "measured":  # rank 0's median step, the number describe() prints
                median_ms = 1e3 * measured[strategy][0].step.median
                where = f"MEASURED on emulated GPUs (this machine), step {median_ms:.1f} ms"
            else:
                where = f"{modelled_title}, step {1e3 * step:.3g} ms"
            ax.set_title(f"{LABELS[strategy]}: {where}", fontsize=9)
    axes[-1, 0].set_xlabel("share of one step (median)")
    axes[-1, 1].set_xlabel("share of one step")
    axes[0, 1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def describe(measured: dict[str, list[RankShare]], cores: int | None = None) -> str:
    """What the rank clocks say, in words chosen by the numbers: who computed, each strategy's step, speedup.

    Args:
        measured: ``{"rank0": shares(...), "ranks": shares(...)}``. cores: shared by the ranks (default: here).
    """
    from course.timing import ratio, speedup_verdict

    lines = []
    for strategy, ranks in measured.items():
        fractions = ", ".join(f"GPU {s.rank} {s.compute_fraction:.0%}" for s in ranks)
        lines.append(f"{LABELS[strategy]:>16}: step {ranks[0].step.format_ms()}; share of the step spent "
                     f"computing: {fractions}")
    alone, shared = measured["rank0"], measured["ranks"]
    helpers = max(s.compute_fraction for s in alone[1:])
    lines.append(f"rank 0 alone: GPU 0 computes {alone[0].compute_fraction:.0%} of each step, the other GPUs "
                 f"{helpers:.0%} at most (they wait in the broadcast); data parallelism: every GPU computes "
                 f"{min(s.compute_fraction for s in shared):.0%}-{max(s.compute_fraction for s in shared):.0%} "
                 "of its step, on a quarter of the batch")
    speedup = ratio(alone[0].step_samples, shared[0].step_samples)
    lines.append(f"data parallelism vs rank 0 alone, measured here: {speedup_verdict(speedup, len(shared), cores)}")
    return "\n".join(lines)


def speedup_in_words(alone_s: float, shared_s: float, world_size: int) -> str:
    """How much ``world_size`` GPUs gain over one (``alone_s`` against ``shared_s`` per step), against the ideal.

    A speedup counts as paying off when it reaches half the ideal ``world_size``x; below that, most of the GPUs'
    time goes to communication, however much faster the step got.
    """
    speedup = alone_s / shared_s
    efficiency = speedup / world_size
    if speedup <= 1:
        verdict = "no faster: communication eats all the compute it saves"
    elif efficiency < 0.5:
        verdict = (f"faster, but far from the ideal {world_size}x: each GPU computes too little per step, so most of "
                   "its time goes to communication")
    else:
        verdict = f"it pays off, at {efficiency:.0%} of the ideal {world_size}x"
    return f"{speedup:.2f}x on {world_size} GPUs ({efficiency:.0%} of the ideal {world_size}x): {verdict}"
