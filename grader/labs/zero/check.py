"""Lab "zero": the student writes ZeRO-1 (Adam with its state sharded over the ranks), checked against DDP + Adam.

The student's ``MyZeRO1Adam(params, lr, betas, eps)`` (stub: ``grader/labs/zero/stub.py``, taught in
``notebooks/07_memory.ipynb``) is called as ``optimizer.step()`` after a plain local backward (no DDP): it
reduce-scatters the gradients so each rank holds the average of its shard, steps Adam on that shard only (the
moments exist for the shard alone), and all-gathers the updated parameters. :func:`check_on_rank` measures, with
:mod:`course.runtime.recorder` installed:

* ``matches_adam``: after each of ``steps`` steps the parameters equal those of torch's
  ``DistributedDataParallel`` + ``torch.optim.Adam`` on the same data (trained first, before the recorder) within
  rounding: a bound derived element by element from the gradients' rounding, the ranks' reduction and Adam's
  division by ``sqrt(v) + eps`` (:mod:`grader.labs.zero.bounds`). A miss names the first step and parameter
  beyond it, "beyond rounding: a bug (bound B, seen E)";
* ``state_memory``: the bytes of the tensors the optimizer object keeps (walked through its attributes; the
  model's parameters and gradients, and tensors sharing their storage, do not count; nor do the parameters of
  a torch optimizer it wraps) are 1/world_size of Adam's two moments, ``2 x 4 x Ψ / world_size`` bytes, within
  one element of rounding per moment and parameter tensor plus 8 bytes of step counter per tensor; and the
  ranks together hold the whole state;
* ``communication``: the bytes a bandwidth-optimal algorithm sends per rank for the collectives called in a
  step equal DDP's allreduce, ``2 (N-1)/N x 4Ψ``, within the padding of (N-1) elements per parameter tensor
  for each of two collectives. Reduce-scatter + all-gather passes; an allreduce followed by keeping the shard
  sends 1.5x (the check accepts reduce-scatter only, though the parameters then match);
* ``uneven``: the same as ``matches_adam`` on a model of 22 parameters in tensors of 15, 3, 3 and 1 elements:
  no length a multiple of the world size, one tensor smaller than it.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import world
from course.runtime.recorder import Recorder, recording
from grader.labs.agree import spreads, total
from grader.labs.core import Check, Finding, Lab, load_entry
from grader.labs.zero.bounds import first_beyond, trajectory_bounds, unnamed

ENTRY = "MyZeRO1Adam"
#: eps near the gradients' size, so a sum is not mistaken for an average (Adam alone is blind to the scale), and
#: a rounding difference in a gradient moves a parameter by at most lr/eps = 10 times as much.
LR, BETAS, EPS = 1e-2, (0.9, 0.999), 1e-3
ADAM = {"lr": LR, "betas": BETAS, "eps": EPS}
BATCH_SIZE, CLASSES = 8, 12

CHECKS = (
    Check("matches_adam", "parameters equal DDP + torch.optim.Adam's after every step, within rounding", 4),
    Check("state_memory", "each rank keeps 1/world_size of Adam's state", 3),
    Check("communication", "bytes sent per step equal DDP's allreduce (reduce-scatter + all-gather)", 2),
    Check("uneven", "lengths that are not multiples of world_size are handled", 2),
)


def _model(seed: int) -> nn.Module:
    """64 -> 48 -> 24 -> 12: every tensor's length (3072, 48, 1152, 24, 288, 12) a multiple of 2, 3 and 4."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 24), nn.ReLU(),
                         nn.Linear(24, CLASSES))


def _uneven_model(seed: int) -> nn.Module:
    """5 -> 3 -> 1 on the flattened input's first 5 features: 22 parameters in tensors of 15, 3, 3 and 1."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), _First(5), nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 1))


class _First(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :self.features]


def _loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    out = model(images)
    if out.shape[1] == 1:  # the uneven model: regress the label
        return nn.functional.mse_loss(out[:, 0], labels.float() / CLASSES)
    return nn.functional.cross_entropy(out, labels)


def global_batch(step: int, seed: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch ``step``: ``BATCH_SIZE`` samples per rank, rank r's in rows r * BATCH_SIZE onwards (CPU)."""
    generator = torch.Generator().manual_seed(10_000 * seed + step)
    images = torch.randn(world_size * BATCH_SIZE, 1, 8, 8, generator=generator)
    return images, torch.randint(0, CLASSES, (world_size * BATCH_SIZE,), generator=generator)


def _batch(step: int, seed: int, me: world.Rank) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``BATCH_SIZE`` samples of global batch ``step`` (the same for the student and the reference)."""
    images, labels = global_batch(step, seed, me.world_size)
    rows = slice(me.rank * BATCH_SIZE, (me.rank + 1) * BATCH_SIZE)
    return images[rows].to(me.device), labels[rows].to(me.device)


def rounding_bounds(model: nn.Sequential, reference: list[torch.Tensor], config: dict, world_size: int
                    ) -> list[torch.Tensor]:
    """How far a correct run's flat parameters may be from ``reference`` (DDP + Adam's) before and after each step
    (:func:`grader.labs.zero.bounds.trajectory_bounds`, on the run's global batches)."""
    batches = [global_batch(step, config["seed"], world_size) for step in range(len(reference) - 1)]
    return trajectory_bounds(model, reference, batches, world_size, ADAM, CLASSES)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def reference_trajectory(model: nn.Module, config: dict, me: world.Rank) -> list[torch.Tensor]:
    """``model``'s parameters before and after each step of DDP + ``torch.optim.Adam`` (flattened, on the CPU)."""
    ddp = DistributedDataParallel(model, device_ids=[me.device.index] if me.device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=LR, betas=BETAS, eps=EPS)
    trajectory = [_flat(model)]
    for step in range(config["steps"]):
        optimizer.zero_grad()
        _loss(ddp, *_batch(step, config["seed"], me)).backward()
        optimizer.step()
        trajectory.append(_flat(model))
    world.settle()  # before the DDP object goes: its last allreduce's worker may still hold a Python object
    return trajectory


def _train_student(my_adam: type, model: nn.Module, config: dict, recorder: Recorder, me: world.Rank
                   ) -> tuple[list[torch.Tensor], list[float], object]:
    """Train ``model`` with the student's optimizer; parameters after each step, bytes sent per step, the optimizer."""
    optimizer = my_adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)
    trajectory, sent = [_flat(model)], []
    for step in range(config["steps"]):
        model.zero_grad(set_to_none=True)
        _loss(model, *_batch(step, config["seed"], me)).backward()
        recorder.clear()
        optimizer.step()
        sent.append(recorder.sent_bytes())
        trajectory.append(_flat(model))
    return trajectory, sent, optimizer


# -- what the optimizer keeps ------------------------------------------------------------------------------------
_NOT_STATE = (nn.Module, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)


def _tensors(value: object, seen: set[int], depth: int = 0) -> Iterator[tuple[torch.Tensor, bool]]:
    """Every tensor reachable from ``value`` through containers and attributes, with whether it is the parameter
    of a torch optimizer found on the way (those count as parameters, not state). Modules are not entered."""
    if id(value) in seen or depth > 6 or isinstance(value, _NOT_STATE):
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value, False
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(key, seen, depth + 1)
            yield from _tensors(item, seen, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _tensors(item, seen, depth + 1)
    elif hasattr(value, "__dict__"):
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                yield from ((p, True) for p in group["params"])
        yield from _tensors(vars(value), seen, depth + 1)


def state_bytes(optimizer: object, model: nn.Module) -> int:
    """Bytes of the storages the optimizer object keeps, other than the model's parameters and gradients."""
    found = list(_tensors(optimizer, set()))
    params = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    excluded = {t.untyped_storage().data_ptr() for t in params} | {
        t.untyped_storage().data_ptr() for t, is_param in found if is_param}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t, _ in found if t.numel()}
    return sum(nbytes for pointer, nbytes in storages.items() if pointer not in excluded)


# -- verdicts (pure functions of what was measured) ---------------------------------------------------------------
def _uncovered(ours: torch.Tensor, ours_start: torch.Tensor, reference: torch.Tensor, reference_start: torch.Tensor
               ) -> str:
    """The wrong shard boundaries, if the numbers say it: flat positions that never moved while Adam's did (on a
    rank whose parameters agree with every other rank's, so no rank updated them)."""
    stuck = ((ours == ours_start) & (reference != reference_start)).nonzero().flatten().tolist()
    if not stuck:
        return ""
    numel, first = ours.numel(), stuck[0]
    tail = stuck == list(range(first, numel))
    where = (f"the last {len(stuck)} of the {numel} parameters (flattened in order)" if tail else
             f"{len(stuck)} of the {numel} parameters (flattened in order, the first at position {first})")
    return (f"{where} never changed, while DDP + Adam moved them: no rank's shard covers them. The shard boundaries "
            "leave a gap: make each shard ceil(numel / world_size) elements and pad the flattened vector, so the "
            "shards cover every parameter")


def judge_matches(check: str, ours: list[torch.Tensor], reference: list[torch.Tensor], spread: list[float],
                  rank: int, model: str = "", limits: list[torch.Tensor] | None = None,
                  layers: nn.Module | None = None) -> Finding:
    """Finding for ``matches_adam`` (or ``uneven``, with ``model`` describing the model): ``ours``/``reference``
    flat parameters before and after each step, ``limits`` how far each entry may be by rounding (None: not at
    all), ``layers`` the model whose ``named_parameters()`` name the entries."""
    limits = limits or [torch.zeros_like(r, dtype=torch.float64) for r in reference]
    step, divergence, judged = first_beyond(ours, reference, limits, layers or unnamed(reference[0]), rank)
    if step == len(reference):
        return Finding(check, True, f"{model}parameters equal DDP + Adam's after each of {len(reference) - 1} steps, "
                       f"{judged}")
    gap = (ours[step] - reference[step]).abs().max().item()
    if step == 0:
        return Finding(check, False, f"{model}rank {rank}'s parameters changed by {gap:.2g} when {ENTRY} was "
                       "built: building the optimizer must not change them")
    start = f"{model}after step {step} rank {rank}'s parameters differ from DDP + Adam's: {divergence or judged}"
    if spread[step] > float(limits[step].max()):
        return Finding(check, False, f"{start}, and the ranks no longer agree (they differ by up to "
                       f"{spread[step]:.2g}): each rank updated only its own shard; all-gather the updated "
                       "shards into every rank's parameters after the step")
    if gap_text := _uncovered(ours[step], ours[0], reference[step], reference[0]):
        return Finding(check, False, f"{start}; {gap_text}")
    return Finding(check, False, f"{start}; check the average (reduce-scatter the sum, then divide by "
                   "world_size), Adam's bias corrections (1 - beta**t, t counted from 1) and eps added after "
                   "the square root")


def judge_memory(held: int, held_by_all: float, moments: int, tensors: int, world_size: int, rank: int
                 ) -> Finding:
    """Finding for ``state_memory``: ``held`` bytes kept on this rank against ``moments`` / ``world_size``."""
    share, slack = moments / world_size, tensors * (2 * 4 + 8)
    within = f"{share:,.0f} bytes (± {slack} for rounding and step counters)"
    if held > share + slack:
        ratio = held / share
        why = ("that is all of Adam's state: every rank stepped the full state; keep exp_avg and exp_avg_sq only for "
               "this rank's shard" if abs(ratio - world_size) < 0.1 * world_size else
               "keep only your shard's two moments between steps (buffers for the whole gradient or all the "
               "parameters belong inside step(), not on self)")
        return Finding("state_memory", False, f"rank {rank} keeps {held:,} bytes of optimizer state, {ratio:.2f}x "
                       f"its share of Adam's two moments, {within}: {why}")
    if held_by_all < moments - world_size * slack:
        return Finding("state_memory", False, f"the {world_size} ranks together keep {held_by_all:,.0f} bytes of "
                       f"optimizer state, less than Adam's two moments ({moments:,} bytes): every element needs "
                       "its exp_avg and exp_avg_sq on exactly one rank")
    return Finding("state_memory", True, f"rank {rank} keeps {held:,} bytes of optimizer state: 1/{world_size} of "
                   f"Adam's {moments:,}, as ZeRO-1 should")


def judge_communication(sent: list[float], numel: int, tensors: int, world_size: int) -> Finding:
    """Finding for ``communication``: bytes sent per step against DDP's allreduce of the same gradients."""
    ddp = 2 * (world_size - 1) / world_size * 4 * numel
    slack = 2 * tensors * (world_size - 1) * 4
    for step, measured in enumerate(sent, start=1):
        if abs(measured - ddp) <= slack:
            continue
        ratio = measured / ddp
        start = (f"step {step} sent {measured:,.0f} bytes per rank, {ratio:.2f}x DDP's allreduce of the same "
                 f"gradients ({ddp:,.0f} bytes, ± {slack} for padding)")
        if measured == 0:
            why = "no collective was called in step(): the ranks never exchanged gradients"
        elif abs(ratio - 1.5) < 0.05:
            why = ("an allreduce and then an all-gather move the gradients in full; reduce-scatter them instead, so "
                   "each rank receives only the sum of its shard")
        elif abs(ratio - 0.5) < 0.05:
            why = "only half of ZeRO-1's traffic: all-gather the updated parameters after the step"
        else:
            why = ("ZeRO-1 sends what DDP sends: one reduce-scatter of the gradients and one all-gather of the "
                   "parameters")
        return Finding("communication", False, f"{start}: {why}")
    return Finding("communication", True, f"each step sent {sent[-1]:,.0f} bytes per rank, as DDP's allreduce")


# -- on every rank ----------------------------------------------------------------------------------------------
def check_on_rank(path: str, config: dict) -> list[Finding]:
    """Run the student's ``MyZeRO1Adam`` from ``path`` on this rank as ``config`` says; one Finding per check.

    An exception from the student's code propagates: the driver (``grader.labs.core``) explains it.
    """
    me, seed = world.current(), config["seed"]
    reference = reference_trajectory(_model(seed).to(me.device), config, me)
    uneven_reference = reference_trajectory(_uneven_model(seed).to(me.device), config, me)
    model = _model(seed).to(me.device)
    with recording(me.world_size) as recorder:
        my_adam = load_entry(path, ENTRY)
        trajectory, sent, optimizer = _train_student(my_adam, model, config, recorder, me)
        held = state_bytes(optimizer, model)
        uneven = _uneven_model(seed).to(me.device)
        uneven_trajectory, _, _ = _train_student(my_adam, uneven, config, recorder, me)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    sizes = ", ".join(str(p.numel()) for p in uneven.parameters())
    described = (f"on a model of {sum(p.numel() for p in uneven.parameters())} parameters (tensors of {sizes} "
                 f"elements, world_size={me.world_size}): ")
    matches = judge_matches("matches_adam", trajectory, reference, spreads(trajectory, me.device), me.rank,
                            f"on an MLP of {numel:,} parameters: ",
                            rounding_bounds(model, reference, config, me.world_size), model)
    uneven_spread = spreads(uneven_trajectory, me.device)
    uneven_limits = rounding_bounds(uneven, uneven_reference, config, me.world_size)
    return [matches,
            judge_memory(held, total(held, me.device), 2 * 4 * numel, len(params), me.world_size, me.rank),
            judge_communication(sent, numel, len(params), me.world_size),
            judge_matches("uneven", uneven_trajectory, uneven_reference, uneven_spread, me.rank, described,
                          uneven_limits, uneven)
            if matches.passed else Finding("uneven", False, f"not judged until the parameters equal DDP + Adam's "
                                           f"(the check above); this one repeats it {described.rstrip(': ')}")]


LAB = Lab(
    name="zero", title="ZeRO-1: Adam with its state sharded over the ranks", notebook="07_memory",
    student_file="labs/zero1_adam.py", entry=ENTRY, checks=CHECKS, rank_check=check_on_rank,
    runs=({"world_size": 4, "seed": 0, "steps": 3, "timeout_s": 120, "label": "{steps} Adam steps"},),
    variant={"world_size": (4, 3), "steps": (3, 4)},  # each student's own; at 3 the 22-parameter model is padded
    uneven={"world_size": 3, "assumes": "4 ranks, or that the parameters divide evenly by the world size"},
    hidden_runs=({"world_size": 3, "seed": "jitter", "steps": 3, "timeout_s": 120, "label": "3 Adam steps"},
                 {"world_size": 2, "seed": "jitter", "steps": 4, "timeout_s": 120, "label": "4 Adam steps"}),
    shortcuts=("torch.distributed.optim:ZeroRedundancyOptimizer",),
    hang_hint=("A hang in this lab usually means the ranks called different collectives, or one rank's "
               "reduce-scatter or all-gather had a different size (pad every rank's buffers to the same length)."),
)
