"""Checks of the training itself: every rank trained to the end on its own reshuffled shard, with equal
parameters, gradients averaged as one process on the union batch would, and the learning rate scaled."""

from __future__ import annotations

from collections.abc import Callable

from course.optimization.lr_scaling import RULES
from grader.assignment import Assignment
from grader.checks.common import (
    Finding,
    cannot_assess,
    copies_of_rank0,
    idle_ranks,
    needs_data_parallel,
    not_assessed,
    ranks_text,
    took,
    unseen_ranks,
)
from grader.evidence import GRADER_FAULT, Evidence, fingerprints_equal
from grader.replay import Transformation, transformation


def ran_to_the_end(ev: Evidence, a: Assignment) -> Finding:
    if ev.status != "ok":
        idle = idle_ranks(ev)
        lone = (f" Before that, {took(idle)}: every rank must train, not only "
                f"{ranks_text([r for r in ev.ranks if r not in idle])}." if 0 < len(idle) < ev.world_size else "")
        return False, f"the run did not finish normally ({ev.status}); see the run's status above.{lone}"
    missing = [r for r in ev.ranks if not ev.inits.get(r)]
    if missing:
        return False, (f"{ranks_text(missing)} never joined a process group: call course.world.init_from_env() "
                       "(or dist.init_process_group) at the start of main().")
    init = ev.inits[0][0]
    if init.world_size != a.world_size or init.backend != ev.expected_backend:
        return False, (f"the process group had world_size={init.world_size} on backend {init.backend}; "
                       f"expected {a.world_size} on {ev.expected_backend}: take both from torchrun's environment.")
    wrong_device = _wrong_devices(ev)
    if wrong_device:
        return False, wrong_device
    idle = idle_ranks(ev)
    if idle:
        return False, (f"{took(idle)}: every rank must train on its own shard "
                       "(an early sys.exit or return, or training only on rank 0?).")
    counts = {r: len(ev.steps[r]) for r in ev.ranks}
    if len(set(counts.values())) > 1:
        return False, f"ranks took different numbers of optimizer steps {counts}: every rank must take every step."
    unclean = [r for r in ev.ranks if not ev.shutdowns.get(r)]
    if unclean:
        return False, (f"{ranks_text(unclean)} did not shut down cleanly: end main() with course.world.shutdown() "
                       "(dist.destroy_process_group()).")
    return True, f"all {a.world_size} ranks joined one {ev.expected_backend} process group, trained " \
                 f"{counts[0]} steps each and shut down cleanly."


def _wrong_devices(ev: Evidence) -> str | None:
    """Ranks whose parameters were not on ``cuda:<LOCAL_RANK>`` (GPUs) or ``cpu`` (emulated), said as a fix."""
    wrong = []
    for r in ev.ranks:
        local_rank = ev.inits[r][0].local_rank
        device = ev.initials[r][0].device if ev.initials.get(r) else None
        expected = f"cuda:{local_rank}" if ev.expected_backend == "nccl" else "cpu"
        if device is not None and device != expected:
            wrong.append(f"rank {r} (LOCAL_RANK={local_rank}) trained on {device}, expected {expected}")
    if not wrong:
        return None
    return ("; ".join(wrong) + ": pick the device by local rank, torch.device('cuda', local_rank) "
            "(course.world.init_from_env() does), and move the model there before building the optimizer.")


def disjoint_shards(ev: Evidence, a: Assignment) -> Finding:
    epochs = {r: ev.epochs(r) for r in ev.ranks}
    idle = idle_ranks(ev)
    if idle:
        return not_assessed(ev, f"needs every rank to train: {took(idle)} (see ran to the end).")
    unseen = unseen_ranks(ev)
    if unseen:
        return cannot_assess(unseen)
    first = {r: epochs[r][min(epochs[r])] for r in ev.ranks}
    n = ev.train_size
    union = set().union(*first.values())
    total = sum(len(v) for v in first.values())
    same = [r for r in ev.ranks if r != 0 and set(first[r]) == set(first[0])]
    if same:
        return False, (f"{ranks_text(same)} saw the same samples as rank 0 in the first epoch: shard the data "
                       "with DistributedSampler(dataset, num_replicas=world_size, rank=rank).")
    if total > n + a.world_size or total - len(union) > a.world_size:
        return False, (f"the ranks fetched {total} samples in the first epoch, {total - len(union)} of them "
                       f"also fetched by another rank, from a training set of {n}: each rank should see its own "
                       "1/world_size of the data; use DistributedSampler.")
    batch = max(len(s.indices) for r in ev.ranks for s in ev.steps.get(r, ())) if ev.steps else 0
    if len(union) < n - a.world_size * max(batch, 1):
        return False, (f"the ranks together saw only {len(union)} of the {n} training samples in the first "
                       "epoch: the shards must cover the data.")
    return True, (f"in the first epoch the {a.world_size} ranks saw disjoint shards "
                  f"({', '.join(str(len(first[r])) for r in ev.ranks)} samples) covering {len(union)} of {n}.")


def reshuffled(ev: Evidence, a: Assignment) -> Finding:
    epochs = {r: ev.epochs(r) for r in ev.ranks}
    idle = idle_ranks(ev)
    if idle:
        return not_assessed(ev, f"needs every rank to train: {took(idle)} (see ran to the end).")
    unseen = unseen_ranks(ev)
    if unseen:
        return cannot_assess(unseen)
    short = [r for r in ev.ranks if len(epochs[r]) < 2]
    if short:
        return not_assessed(ev, (f"fewer than two training epochs were seen on {ranks_text(short)}: train for the "
                                  "full epoch budget."))
    same = copies_of_rank0(ev)
    if same:  # a DataLoader with shuffle=True reshuffles all the data, not a shard
        return False, (f"needs each rank to draw its own shard: {ranks_text(same)} drew rank 0's samples at every "
                       "step (see disjoint shards); then call sampler.set_epoch(epoch) every epoch.")
    unchanged = []
    for r in ev.ranks:
        first, second = sorted(epochs[r])[:2]
        if epochs[r][first] == epochs[r][second]:
            unchanged.append(r)
    if unchanged:
        return False, (f"{ranks_text(unchanged)} drew the same samples in the same order in epochs 0 and 1: call "
                       "sampler.set_epoch(epoch) at the start of every epoch so each epoch is shuffled anew.")
    return True, "every rank drew its own samples in a new order each epoch."


def equal_parameters(ev: Evidence, a: Assignment) -> Finding:
    initial = {r: ev.initials[r][0].fingerprint for r in ev.ranks if ev.initials.get(r)}
    if len(initial) < a.world_size:
        idle = [r for r in ev.ranks if r not in initial]
        return not_assessed(ev, f"needs every rank to train: {took(idle)} (see ran to the end).")
    differ = [r for r in ev.ranks if not fingerprints_equal(initial[r], initial[0])]
    if differ:
        return False, (f"{ranks_text(differ)} started from different parameters than rank 0: wrap the model in "
                       "DistributedDataParallel (it broadcasts rank 0's parameters) or broadcast them yourself.")
    steps = min(len(ev.steps.get(r, ())) for r in ev.ranks)
    for i in range(steps):
        differ = [r for r in ev.ranks if not fingerprints_equal(ev.steps[r][i].fingerprint,
                                                                 ev.steps[0][i].fingerprint)]
        if differ:
            return False, (f"after step {i + 1} the parameters of {ranks_text(differ)} differ from rank 0's"
                           + _short_batch(ev, i) + ": every rank must apply the same averaged gradient (DDP, or "
                           "all_reduce the gradients) and change its parameters in no other way (no per-rank random "
                           "noise or re-initialisation).")
    needs = needs_data_parallel(ev)
    if needs:
        return needs
    return True, (f"all ranks held identical parameters at the start and after each of {steps} steps, "
                  "each rank having trained on its own batches.")


def _short_batch(ev: Evidence, i: int) -> str:
    """`` (step 10 was the short last batch of an epoch: ...)`` when rank 0's step ``i`` (from 0) trained on
    fewer samples than its full steps and ended an epoch, and the steps before it kept the ranks equal, else ''."""
    steps = ev.steps[0]
    full = max(len(s.indices) for s in steps)
    last_of_epoch = i + 1 == len(steps) or steps[i + 1].epoch != steps[i].epoch
    if not 0 < len(steps[i].indices) < full or not last_of_epoch or i == 0:
        return ""
    return (f" (step {i + 1} was the short last batch of an epoch: {len(steps[i].indices)} samples "
            f"on rank 0 instead of {full}, and the steps before it kept the ranks equal: that batch's gradients "
            "were not averaged; average every batch, the short last one included)")


def matches_single_process(ev: Evidence, a: Assignment) -> Finding:
    needs = needs_data_parallel(ev)
    if needs:
        return needs
    if ev.replay_error == GRADER_FAULT:
        return cannot_assess(f"{GRADER_FAULT}.")
    if ev.replay_error or not ev.comparisons:
        return False, f"the grader could not replay the first steps: {ev.replay_error or 'no steps recorded'}."
    precision = next((s.precision for s in ev.steps[0] if s.precision), None)
    tolerance = dict(a.low_precision_tolerance).get(precision or "", a.gradient_tolerance)
    rounding = f", within {precision} rounding" if precision else ""
    done = transformation(ev.comparisons, tolerance)
    if done is not None and done.kind == "clipped":
        worst = max(c.direction_error for c in ev.comparisons)
        first = _clipped(ev.comparisons, tolerance)
        return True, (f"the first {len(ev.comparisons)} steps match one process training on the union of the "
                      f"{a.world_size} ranks' batches, with the gradient clipped to norm {done.value:.3g} on every "
                      f"rank (clip_grad_norm_). At step {first.step} the clipping made it {first.scale:.2f}x as "
                      f"long, pointing the same way (relative error at most {worst:.1e}{rounding}).")
    for c in ev.comparisons:
        if c.relative_error > tolerance:
            return False, _gradient_mismatch(c, a.world_size, precision, tolerance, done)
    worst = max(c.relative_error for c in ev.comparisons)
    return True, (f"the first {len(ev.comparisons)} steps match one process training on the union of the "
                  f"{a.world_size} ranks' batches (relative error at most {worst:.1e}{rounding}; gradient scale "
                  f"{min(c.scale for c in ev.comparisons):.3f}).")


def _clipped(comparisons, tolerance: float):
    """The first comparison the clipping shortened."""
    return next(c for c in comparisons if c.relative_error > tolerance)


def _gradient_mismatch(c, world_size: int, precision: str | None, tolerance: float,
                       done: Transformation | None = None) -> str:
    """What the measured scale of rank 0's gradient against the single-process one says went wrong."""
    measured = (f"at step {c.step} rank 0's gradient was {c.scale:.2f}x the single-process gradient on the union "
                f"batch (relative error {c.relative_error:.2g}, allowed {tolerance:g}"
                + (f" for {precision}" if precision else "") + ")")
    if abs(c.scale - world_size) < 0.1 * world_size:
        return f"{measured}: the gradients were summed, not averaged; divide by world_size."
    if abs(c.scale - 1 / world_size) < 0.1 / world_size:
        return (f"{measured}: the gradients were divided by world_size twice (DDP already averages; do not divide "
                "the loss or the gradients again).")
    if done is not None:  # scaled: clipping passed above
        return (f"{measured}: it pointed the same way, {done.value:.2f}x as long at every step. The gradients were "
                f"averaged, then multiplied by {done.value:.2f} on every rank (a factor on the loss or on the "
                "gradients?). Remove the factor; to change the step size, change the learning rate.")
    if abs(c.scale - 1) < 0.1:
        return (f"{measured}: the right size, pointing elsewhere: the ranks' gradients were not combined (each "
                "rank stepped on its own batch), or they were computed on other samples than the batches fetched.")
    return f"{measured}: the gradients were not averaged across ranks."


# What notebook 02 (course.optimization.lr_scaling) teaches for a k-times bigger global batch: linear scaling (Goyal
# et al. 2017, for SGD) everywhere; the sqrt rule too for Adam-family optimizers (Malladi et al. 2022).
ADAPTIVE_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam")


def lr_rules(optimizer: str | None) -> dict[str, Callable[[float], float]]:
    """The scaling rules the course accepts for ``optimizer`` (its class name): rule -> ``k -> factor``."""
    names = ("linear", "sqrt") if optimizer in ADAPTIVE_OPTIMIZERS else ("linear",)
    return {name: RULES[name] for name in names}


def lr_scaled(ev: Evidence, a: Assignment) -> Finding:
    alone, idle = [r for r in ev.ranks if not ev.inits.get(r)], idle_ranks(ev)
    if 0 in idle:
        return not_assessed(ev, "rank 0 took no optimizer step.")
    steps = ev.steps[0]
    if alone or idle:
        batch = len(steps[0].indices)
        why = (f"{ranks_text(alone)} never joined a process group, so each process took its steps of {batch} "
               "samples alone (one process, nn.DataParallel included, is not the assignment)" if alone else
               f"{took(idle)}, so no step averaged the ranks' batches")
        return not_assessed(ev, f"needs a global batch to scale for: {why}; see ran to the end.")
    global_batch = sum(len(ev.steps[r][0].indices) for r in ev.ranks)
    if not global_batch:
        return cannot_assess(unseen_ranks(ev) or "the grader could not tell how many samples the first step "
                             "averaged, so the global batch the learning rate scales with is unknown.")
    k = global_batch / a.base_batch_size
    optimizer = steps[0].optimizer
    rules = {rule: a.base_lr * factor(k) for rule, factor in lr_rules(optimizer).items()}
    lrs = [s.lr[0] for s in steps]
    peak = max(lrs)
    seen = next((rule for rule, lr in rules.items() if abs(peak / lr - 1) <= a.lr_tolerance), None)
    if seen is None:
        expected = " or ".join(f"{rule} {lr:.4g}" for rule, lr in rules.items())
        return False, (f"the peak learning rate was {peak:.4g}, but each step averages {global_batch} samples "
                       f"({k:g}x the starter's {a.base_batch_size}): scale {a.base_lr:g} by a rule notebook 02 "
                       f"teaches for {optimizer or 'this optimizer'}: {expected}.")
    if lrs[0] >= 0.99 * peak:
        return False, (f"the learning rate started at its peak {peak:.4g}: warm it up over the first steps "
                       "(e.g. LambdaLR with min(1, (step + 1) / warmup_steps)).")
    return True, (f"learning rate scaled by the {seen} rule ({optimizer or 'optimizer'}) to {peak:.4g} for a "
                  f"global batch of {global_batch}, warmed up from {lrs[0]:.3g}.")
