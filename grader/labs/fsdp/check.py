"""Lab "fsdp": the student writes FSDP (ZeRO-3) by hand on a small multi-layer model, checked against DDP + Adam.

The student's ``MyFSDP(model)`` (stub: ``grader/labs/fsdp/stub.py``, taught in ``notebooks/07_memory.ipynb``)
keeps 1/world_size of every ``nn.Linear``'s parameters (``self.shards``, in the layout its docstring fixes),
all-gathers a layer's parameters just before its forward, lets them go after it, gathers them again for its
backward and reduce-scatters the gradients into the shards' ``.grad``; ``torch.optim.Adam`` steps the shards.
:func:`check_on_rank` measures, with :mod:`course.runtime.recorder` installed:

* ``matches_adam``: after each of ``steps`` steps the full parameters (the checker gathers the shards with its
  own, unrecorded collective) equal those of torch's ``DistributedDataParallel`` + ``torch.optim.Adam`` on the
  same data within rounding: the zero lab's bound (:mod:`grader.labs.zero.bounds`), derived from the gradients'
  rounding, the reduce-scatter's order and Adam's division by ``sqrt(v) + eps``; a miss names the first step and
  layer beyond it;
* ``memory``: the shards are 1/world_size of the model (padded), and at every all-gather the gathered parameters
  still alive (tensors the gathers wrote into, kept by the student or by autograd) are at most one layer's: the
  measured peak of parameter bytes per rank is 1/N of the model plus one layer. A student who prefetches (any
  ``async_op=True`` gather) holds two layers at once, the one computing and the one arriving: the bound is then
  the two largest layers;
* ``communication``: the bytes a bandwidth-optimal algorithm sends per rank in a step are 1.5x DDP's allreduce
  (two all-gathers and one reduce-scatter of the parameters, each (N-1)/N of them, against the allreduce's
  2(N-1)/N), within the padding;
* ``prefetch`` (the stretch goal): in forward, and again in backward, every layer's all-gather but the first was
  issued (``async_op=True``) before a matrix multiply of the layer before it and its data first waited for after
  it: timestamps of every matrix multiply on the rank (a ``TorchDispatchMode``) against each gather's launch and
  first wait (``wait()``, or taking its future to wait on), as the DDP lab checks its allreduces against
  backward's gradients. An asynchronous gather's result lands in the student's tensor only at that first wait
  (:class:`grader.labs.late_results.Late`), so reading it earlier is wrong every time, and a second ``wait()``
  later does not make an early one overlap anything. The list form of ``dist.all_gather`` is watched as the
  tensor forms are, for memory and for timing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from course import world
from course.runtime.collective_names import named
from course.runtime.recorder import ORIGINAL, Recorder, recording
from grader.labs.agree import spreads
from grader.labs.core import Check, Finding, Lab, StudentError, load_entry
from grader.labs.fsdp.gathers import Gather, MatmulClock, watching_gathers
from grader.labs.zero.bounds import first_beyond, unnamed
from grader.labs.zero.check import BETAS, EPS, LR, _batch, _loss, reference_trajectory, rounding_bounds

ENTRY = "MyFSDP"
CLASSES = 12
CHECKS = (
    Check("matches_adam", "parameters equal DDP + torch.optim.Adam's after every step, within rounding", 4),
    Check("memory", "each rank holds 1/world_size of the parameters plus at most one gathered layer", 3),
    Check("communication", "bytes sent per step are 1.5x DDP's allreduce (gather twice, reduce-scatter once)", 2),
    Check("prefetch", "stretch goal: the next layer's all-gather runs while this layer computes (forward and "
          "backward)", 2),
)


def _model(config: dict) -> nn.Sequential:
    """64 -> hidden -> ... -> hidden -> 12 in ``layers`` Linear layers (published: 64 -> 32 -> 32 -> 32 -> 12, four
    layers, the middle two of 1,056 parameters each), seeded by ``config["seed"]``."""
    hidden, layers = config.get("hidden", 32), config.get("layers", 4)
    torch.manual_seed(config["seed"])
    modules: list[nn.Module] = [nn.Flatten()]
    for index in range(layers):
        modules.append(nn.Linear(64 if index == 0 else hidden, CLASSES if index == layers - 1 else hidden))
        if index < layers - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


def _linears(model: nn.Sequential) -> list[nn.Linear]:
    return [module for module in model if isinstance(module, nn.Linear)]


def _piece(linear: nn.Linear, world_size: int) -> int:
    """Elements of one rank's piece of ``linear`` (weight and bias, padded to a multiple of world_size)."""
    return -(-(linear.weight.numel() + linear.bias.numel()) // world_size)


def full_parameters(fsdp: nn.Module, linears: list[nn.Linear], me: world.Rank) -> torch.Tensor:
    """The model's parameters, flattened in ``model.parameters()`` order, gathered from the student's shards."""
    shards = list(getattr(fsdp, "shards", []))
    if len(shards) != len(linears):
        raise StudentError(f"{ENTRY}.shards has {len(shards)} pieces; the model has {len(linears)} nn.Linear "
                           "layers: keep one nn.Parameter per Linear in self.shards (an nn.ParameterList), in order")
    flat = []
    for index, (shard, linear) in enumerate(zip(shards, linears, strict=True)):
        piece = _piece(linear, me.world_size)
        if shard.numel() != piece:
            raise StudentError(f"rank {me.rank}'s shard of layer {index} has {shard.numel()} elements; the layout "
                               f"asks for ceil(({linear.weight.numel()} + {linear.bias.numel()}) / world_size) = "
                               f"{piece}: pad the flattened weight and bias to a multiple of world_size, then cut")
        full = torch.empty(piece * me.world_size, dtype=shard.dtype, device=shard.device)
        # torch's own function under its newest name (the deprecated one calls the watched new name)
        ORIGINAL[named("all_gather_single")](full, shard.detach().reshape(-1))
        flat.append(full[:linear.weight.numel() + linear.bias.numel()].cpu().clone())
    return torch.cat(flat)


@dataclass
class Overlap:
    """One pass (forward or backward) of one step: its gathers' (launched, waited) times and its matmuls'."""

    step: int
    direction: str  # "forward" or "backward"
    gathers: list[tuple[float, float, bool]]  # (launched, waited, async_op); waited inf if never waited
    matmuls: list[float]

    def overlapped(self) -> int:
        """Gathers during which a matrix multiply ran (launched before it, waited for after it)."""
        return sum(any(launched < t < waited for t in self.matmuls) for launched, waited, _ in self.gathers)


def _passes(step: int, watched: list[Gather], matmuls: list[float], backward_start: float) -> list[Overlap]:
    """The step's gathers and matmuls, split into its forward and its backward."""
    gathers = [(g.launched, g.waited, g.async_op) for g in watched]
    return [Overlap(step, "forward", [g for g in gathers if g[0] < backward_start],
                    [t for t in matmuls if t < backward_start]),
            Overlap(step, "backward", [g for g in gathers if g[0] >= backward_start],
                    [t for t in matmuls if t >= backward_start])]


def _train_student(my_fsdp: type, config: dict, recorder: Recorder, me: world.Rank
                   ) -> tuple[list[torch.Tensor], list[float], int, int, bool, list[Overlap]]:
    """Train with the student's class; full parameters after each step, bytes sent per step, the shards' bytes,
    the peak bytes of gathered parameters alive at once, whether any gather was asynchronous, and each pass's
    gathers and matmuls."""
    model = _model(config).to(me.device)
    linears = _linears(model)
    with watching_gathers() as watch:
        fsdp = my_fsdp(model)
        del model  # the student's shards are what is left; the full layers go unless the student keeps them
        optimizer = torch.optim.Adam(fsdp.parameters(), lr=LR, betas=BETAS, eps=EPS)
        trajectory, sent, passes = [full_parameters(fsdp, linears, me)], [], []
        watch.peak = 0  # from here on: what training holds
        for step in range(1, config["steps"] + 1):
            optimizer.zero_grad(set_to_none=True)
            recorder.clear()
            watch.gathers = []
            with MatmulClock() as clock:
                loss = _loss(fsdp, *_batch(step - 1, config["seed"], me))
                backward_start = time.perf_counter()
                loss.backward()
            optimizer.step()
            sent.append(recorder.sent_bytes())
            passes += _passes(step, watch.gathers, clock.times, backward_start)
            trajectory.append(full_parameters(fsdp, linears, me))
    kept = sum(p.numel() * p.element_size() for p in fsdp.parameters())
    return trajectory, sent, kept, watch.peak, watch.prefetched, passes


# -- verdicts (pure functions of what was measured) ---------------------------------------------------------------
def judge_matches(ours: list[torch.Tensor], reference: list[torch.Tensor], spread: list[float], rank: int,
                  limits: list[torch.Tensor] | None = None, model: nn.Module | None = None) -> Finding:
    """Finding for ``matches_adam``: full parameters before and after each step against DDP + Adam's, each entry
    within ``limits`` (rounding's bound; None: not at all), named by ``model``'s ``named_parameters()``."""
    limits = limits or [torch.zeros_like(r, dtype=torch.float64) for r in reference]
    step, divergence, judged = first_beyond(ours, reference, limits, model or unnamed(reference[0]), rank)
    if step == len(reference):
        return Finding("matches_adam", True, f"parameters equal DDP + Adam's after each of {len(reference) - 1} "
                       f"steps, {judged}")
    gap = (ours[step] - reference[step]).abs().max().item()
    if step == 0:
        return Finding("matches_adam", False, f"rank {rank}'s shards, gathered, differ from the model's "
                       f"parameters by {gap:.2g} before any step: cut each layer's flattened weight and bias "
                       "(weight first, padded) into world_size pieces and keep piece rank")
    start = f"after step {step} the parameters differ from DDP + Adam's: {divergence or judged}"
    if spread[step] > float(limits[step].max()):
        return Finding("matches_adam", False, f"{start}, and the ranks' gathered parameters disagree: every "
                       "rank must hold the same pieces after gathering")
    ratio = ((ours[step] - ours[step - 1]).abs().sum() / (reference[step] - reference[step - 1]).abs().sum())
    return Finding("matches_adam", False, f"{start}; your steps are {ratio.item():.2f}x as large: check the "
                   "gradients of weight and bias, and divide the reduce-scattered sum by world_size")


def judge_memory(kept: int, peak: int, model_bytes: int, layer_bytes: int, world_size: int,
                 prefetched: bool = False, two_layers_bytes: int = 0) -> Finding:
    """Finding for ``memory``: shards ``kept`` bytes against 1/N of ``model_bytes``; gathered ``peak`` against the
    largest layer's ``layer_bytes`` or, for a student who ``prefetched``, the two largest layers' (all padded)."""
    share = model_bytes / world_size
    if kept > share + 4 * world_size * 4:  # padding: under one element per rank per layer
        return Finding("memory", False, f"each rank keeps {kept:,} bytes of parameters, {kept / share:.2f}x its "
                       f"share (1/{world_size} of {model_bytes:,}): keep only your pieces as parameters, not the "
                       "full layers")
    if prefetched and peak > two_layers_bytes:
        return Finding("memory", False, f"{peak:,} bytes of gathered parameters were alive at once; prefetching "
                       f"holds two layers, the one computing and the one arriving (at most {two_layers_bytes:,} "
                       "bytes here): let each layer's full parameters go once it is computed")
    if not prefetched and peak > layer_bytes:
        return Finding("memory", False, f"{peak:,} bytes of gathered parameters were alive at once, "
                       f"{peak / layer_bytes:.1f} layers' worth (the largest layer is {layer_bytes:,} bytes): let a "
                       "layer's full parameters go after its forward (keep no reference, save only the input and "
                       "your piece for backward) and gather them again in backward")
    held = "two layers: this one and the one prefetched" if prefetched else "one layer"
    return Finding("memory", True, f"{kept:,} bytes of shards per rank and at most {peak:,} gathered ({held})")


def judge_communication(sent: list[float], model_bytes: int, layers: int, world_size: int) -> Finding:
    """Finding for ``communication``: bytes sent in each step against 1.5x DDP's allreduce, within the padding."""
    ddp = 2 * (world_size - 1) / world_size * model_bytes
    slack = 3 * (world_size - 1) * 4 * layers  # under one padded element per rank per layer and collective
    for step, bytes_sent in enumerate(sent, start=1):
        if abs(bytes_sent - 1.5 * ddp) <= slack:
            continue
        ratio = bytes_sent / ddp
        why = (" (an allreduce of the gradients sends twice a reduce-scatter: reduce-scatter them instead)"
               if abs(ratio - 2.0) < 0.1 else
               " (one all-gather too few: gather each layer in forward and again in backward)" if abs(ratio - 1.0)
               < 0.1 else "")
        return Finding("communication", False, f"step {step} sent {bytes_sent:,.0f} bytes per rank, {ratio:.2f}x "
                       f"DDP's allreduce of the same model ({ddp:,.0f}); FSDP sends 1.5x: two all-gathers and one "
                       f"reduce-scatter of the parameters{why}")
    return Finding("communication", True, f"{sent[0]:,.0f} bytes per step, 1.5x DDP's allreduce")


def judge_prefetch(passes: list[Overlap]) -> Finding:
    """Finding for ``prefetch``: in each pass every gather but the first overlapped a matrix multiply."""
    for one in passes:
        if one.overlapped() >= len(one.gathers) - 1:
            continue
        order = "the next layer's" if one.direction == "forward" else "the previous layer's (backward runs in reverse)"
        if not any(async_op for _, _, async_op in one.gathers):
            why = "every all-gather was blocking, so each layer waited for its parameters"
        else:
            why = ("you waited for each asynchronous all-gather before any layer computed: issuing it and waiting at "
                   "once overlaps nothing")
        return Finding("prefetch", False, f"step {one.step}, {one.direction}: {one.overlapped()} of "
                       f"{len(one.gathers)} all-gathers ran while a layer computed; {why}. Stretch goal: start "
                       f"{order} all-gather (async_op=True) before computing this layer, and wait() for it just "
                       "before that layer needs it")
    return Finding("prefetch", True, "every layer's all-gather but the first ran while the layer before it computed, "
                   "in forward and in backward")


# -- on every rank ----------------------------------------------------------------------------------------------
def check_on_rank(path: str, config: dict) -> list[Finding]:
    """Run the student's ``MyFSDP`` from ``path`` on this rank as ``config`` says; one Finding per check."""
    me = world.current()
    reference = reference_trajectory(_model(config).to(me.device), config, me)
    linears = _linears(_model(config))
    with recording(me.world_size) as recorder:
        my_fsdp = load_entry(path, ENTRY)
        trajectory, sent, kept, peak, prefetched, passes = _train_student(my_fsdp, config, recorder, me)
    padded = sorted(_piece(linear, me.world_size) * me.world_size * 4 for linear in linears)
    model_bytes = sum(p.numel() * p.element_size() for p in _model(config).parameters())
    fresh = _model(config)  # the bound's model, whose parameter names name a miss
    limits = rounding_bounds(fresh, reference, config, me.world_size)
    return [judge_matches(trajectory, reference, spreads(trajectory, me.device), me.rank, limits, fresh),
            judge_memory(kept, peak, sum(padded), padded[-1], me.world_size, prefetched, sum(padded[-2:])),
            judge_communication(sent, model_bytes, len(linears), me.world_size),
            judge_prefetch(passes)]


LAB = Lab(
    name="fsdp", title="FSDP (ZeRO-3) by hand: gather per layer, free, reduce-scatter gradients",
    notebook="07_memory", student_file="labs/fsdp.py", entry=ENTRY, checks=CHECKS,
    rank_check=check_on_rank,
    runs=({"world_size": 4, "seed": 0, "steps": 3, "hidden": 32, "layers": 4, "timeout_s": 120,
           "label": "{steps} Adam steps of a {layers}-layer MLP of width {hidden}"},),
    # each student's own layer sizes and number of layers (grader.labs.variant)
    variant={"hidden": (32, 24, 40, 48), "layers": (4, 3, 5)},
    uneven={"world_size": 3, "assumes": "4 ranks, or that each layer's length divides evenly by the world size"},
    hidden_runs=({"world_size": 3, "seed": "jitter", "steps": 3, "timeout_s": 120, "label": "3 Adam steps"},
                 {"world_size": 2, "seed": "jitter", "steps": 2, "timeout_s": 120, "label": "2 Adam steps"}),
    shortcuts=("torch.distributed.fsdp:fully_shard", "torch.distributed.fsdp:FullyShardedDataParallel",
               "torch.distributed.optim:ZeroRedundancyOptimizer"),
    hang_hint=("A hang in this lab usually means the ranks gathered different layers, or pieces of different "
               "sizes: every rank must gather every layer, in the same order, with pieces of the same length."),
)

__all__ = ["LAB", "Overlap", "check_on_rank", "full_parameters", "judge_communication", "judge_matches",
           "judge_memory", "judge_prefetch"]
