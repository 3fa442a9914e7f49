"""The checks, declared in one place: each has points, a visibility and a message in the course's terms.

A check reads only the :class:`~grader.evidence.Evidence` of a run (the trusted probes' records and the
grader's own evaluation) and returns whether it passed and what to tell the student. ``CHECKS`` is the
whole rubric; the self-check (``grader check``) runs the ``visible`` ones. Every check is proven by a
submission in ``tests/submissions/`` that must fail it alone. Where a rank's records can be checked against
what the grader measured itself (the checkpoint's parameters and validation accuracy), they are: a rank's
process can sign records as that rank (see :mod:`grader.channel`), so forging one gains nothing. Used by
the grader of notebook 06.

A check credits only the behaviour its title names, seen happening: ranks that all train on rank 0's batches stay
identical with or without averaging, so equal parameters show nothing there, and the check fails saying what it
needs ("needs each rank to see its own shard: see disjoint shards"). When the run did not finish, a check left
without its evidence says "not assessed" and gives no advice (the run's status says what happened). A failed
check declared ``voids_score`` (integrity) withholds the whole score, see :class:`grader.results.Results`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from grader.assignment import Assignment
from grader.evidence import Evidence, fingerprints_equal

Outcome = tuple[bool, str]


@dataclass(frozen=True)
class Check:
    """One line of the rubric.

    Attributes:
        name: stable identifier (CSV column, Gradescope test name).
        title: what is checked, in one phrase.
        points: score when passed (0 when failed).
        visibility: Gradescope's ``visible``, ``after_published`` or ``hidden``; the self-check runs ``visible``.
        test: ``(evidence, assignment) -> (passed, message)``.
        voids_score: when failed, the submission's score is withheld (0, the raw score kept for the
            instructor's review): the records every other check rests on cannot be trusted.
    """

    name: str
    title: str
    points: float
    visibility: str
    test: Callable[[Evidence, Assignment], Outcome]
    voids_score: bool = False


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _took(ranks: list[int]) -> str:
    return f"{_ranks(ranks)} took no optimizer step"


def _not_assessed(ev: Evidence, advice: str) -> Outcome:
    """A failure for lack of evidence: ``advice`` if the run finished, else "not assessed" and no advice
    (what was never seen is the crash's doing, which the run's status names)."""
    if ev.status != "ok":
        return False, f"not assessed: the run did not finish ({ev.status}); see the run's status above."
    return False, advice


def _idle(ev: Evidence) -> list[int]:
    """Ranks that took no optimizer step."""
    return [r for r in ev.ranks if not ev.steps.get(r)]


def _copies_of_rank0(ev: Evidence) -> list[int]:
    """Ranks other than 0 that fetched exactly rank 0's samples at every step both took (so whatever they did,
    their parameters stay rank 0's: their equality shows nothing about averaging)."""
    def batches(r: int) -> list[list[int]]:
        return [sorted(s.get("indices", [])) for s in ev.steps.get(r, [])]
    mine = batches(0)
    return [r for r in ev.ranks if r != 0 and mine and batches(r)
            and all(a == b for a, b in zip(batches(r), mine, strict=False))]


def _needs_data_parallel(ev: Evidence) -> Outcome | None:
    """Why the run cannot show gradients averaged across ranks that saw different data (what the check needs,
    as a failure), or None when it can."""
    alone = [r for r in ev.ranks if not ev.inits.get(r)]
    idle = _idle(ev)
    if alone or idle:
        if alone:
            advice = (f"needs the ranks to join one process group: {_ranks(alone)} never did, so each process "
                      "trained alone and nothing was averaged across processes (one process, nn.DataParallel "
                      "included, is not the assignment): see ran to the end.")
        else:
            advice = (f"needs every rank to train: {_took(idle)}, so no step combined the ranks' batches "
                      "(the union batch is the training ranks' alone): see ran to the end.")
        return _not_assessed(ev, advice)
    if not any(s.get("indices") for s in ev.steps[0]):
        return False, ("needs the samples each rank trained on: build the training DataLoader on "
                       "data.load().train itself (see disjoint shards).")
    same = _copies_of_rank0(ev)
    if same:
        return False, (f"needs each rank to see its own shard: {_ranks(same)} trained on rank 0's batches at "
                       "every step, so they stay equal to rank 0 whether or not gradients are averaged "
                       "(see disjoint shards).")
    return None


def ran_to_the_end(ev: Evidence, a: Assignment) -> Outcome:
    if ev.status != "ok":
        idle = _idle(ev)
        lone = (f" Before that, {_took(idle)}: every rank must train, not only "
                f"{_ranks([r for r in ev.ranks if r not in idle])}." if 0 < len(idle) < ev.world_size else "")
        return False, f"the run did not finish normally ({ev.status}); see the run's status above.{lone}"
    missing = [r for r in ev.ranks if not ev.inits.get(r)]
    if missing:
        return False, (f"{_ranks(missing)} never joined a process group: call course.world.init_from_env() "
                       "(or dist.init_process_group) at the start of main().")
    init = ev.inits[0][0]
    if init["world_size"] != a.world_size or init["backend"] != ev.expected_backend:
        return False, (f"the process group had world_size={init['world_size']} on backend {init['backend']}; "
                       f"expected {a.world_size} on {ev.expected_backend}: take both from torchrun's environment.")
    wrong_device = _wrong_devices(ev)
    if wrong_device:
        return False, wrong_device
    idle = _idle(ev)
    if idle:
        return False, (f"{_took(idle)}: every rank must train on its own shard "
                       "(an early sys.exit or return, or training only on rank 0?).")
    counts = {r: len(ev.steps[r]) for r in ev.ranks}
    if len(set(counts.values())) > 1:
        return False, f"ranks took different numbers of optimizer steps {counts}: every rank must take every step."
    unclean = [r for r in ev.ranks if not ev.shutdowns.get(r)]
    if unclean:
        return False, (f"{_ranks(unclean)} did not shut down cleanly: end main() with course.world.shutdown() "
                       "(dist.destroy_process_group()).")
    return True, f"all {a.world_size} ranks joined one {ev.expected_backend} process group, trained " \
                 f"{counts[0]} steps each and shut down cleanly."


def _wrong_devices(ev: Evidence) -> str | None:
    """Ranks whose parameters were not on ``cuda:<LOCAL_RANK>`` (GPUs) or ``cpu`` (emulated), said as a fix."""
    wrong = []
    for r in ev.ranks:
        local_rank = ev.inits[r][0].get("local_rank")
        device = (ev.initials.get(r) or [{}])[0].get("device")
        expected = f"cuda:{local_rank}" if ev.expected_backend == "nccl" else "cpu"
        if device is not None and device != expected:
            wrong.append(f"rank {r} (LOCAL_RANK={local_rank}) trained on {device}, expected {expected}")
    if not wrong:
        return None
    return ("; ".join(wrong) + ": pick the device by local rank, torch.device('cuda', local_rank) "
            "(course.world.init_from_env() does), and move the model there before building the optimizer.")


def _diverged_at(ev: Evidence) -> int | None:
    """The first step after which some rank's parameters differed from rank 0's (0: from the start), or None."""
    initial = {r: ev.initials[r][0]["fingerprint"] for r in ev.ranks if ev.initials.get(r)}
    if 0 in initial and any(not fingerprints_equal(f, initial[0]) for f in initial.values()):
        return 0
    steps = min((len(ev.steps.get(r, [])) for r in ev.ranks), default=0)
    for i in range(steps):
        if any(not fingerprints_equal(ev.steps[r][i]["fingerprint"], ev.steps[0][i]["fingerprint"])
               for r in ev.ranks):
            return i + 1
    return None


def disjoint_shards(ev: Evidence, a: Assignment) -> Outcome:
    epochs = {r: ev.epochs(r) for r in ev.ranks}
    idle = _idle(ev)
    if idle:
        return _not_assessed(ev, f"needs every rank to train: {_took(idle)} (see ran to the end).")
    unseen = [r for r in ev.ranks if not epochs[r]]
    if unseen:
        return _not_assessed(ev, (f"the grader saw no training samples fetched on {_ranks(unseen)}: build the "
                                  "training DataLoader on data.load().train itself (not on its tensors)."))
    first = {r: epochs[r][min(epochs[r])] for r in ev.ranks}
    n = ev.train_size
    union = set().union(*first.values())
    total = sum(len(v) for v in first.values())
    same = [r for r in ev.ranks if r != 0 and set(first[r]) == set(first[0])]
    if same:
        return False, (f"{_ranks(same)} saw the same samples as rank 0 in the first epoch: shard the data "
                       "with DistributedSampler(dataset, num_replicas=world_size, rank=rank).")
    if total > n + a.world_size or total - len(union) > a.world_size:
        return False, (f"the ranks fetched {total} samples in the first epoch, {total - len(union)} of them "
                       f"also fetched by another rank, from a training set of {n}: each rank should see its own "
                       "1/world_size of the data; use DistributedSampler.")
    batch = max(len(s["indices"]) for r in ev.ranks for s in ev.steps.get(r, [])) if ev.steps else 0
    if len(union) < n - a.world_size * max(batch, 1):
        return False, (f"the ranks together saw only {len(union)} of the {n} training samples in the first "
                       "epoch: the shards must cover the data.")
    return True, (f"in the first epoch the {a.world_size} ranks saw disjoint shards "
                  f"({', '.join(str(len(first[r])) for r in ev.ranks)} samples) covering {len(union)} of {n}.")


def reshuffled(ev: Evidence, a: Assignment) -> Outcome:
    epochs = {r: ev.epochs(r) for r in ev.ranks}
    idle = _idle(ev)
    if idle:
        return _not_assessed(ev, f"needs every rank to train: {_took(idle)} (see ran to the end).")
    short = [r for r in ev.ranks if len(epochs[r]) < 2]
    if short:
        return _not_assessed(ev, (f"fewer than two training epochs were seen on {_ranks(short)}: train for the "
                                  "full epoch budget."))
    same = _copies_of_rank0(ev)
    if same:  # a DataLoader with shuffle=True reshuffles all the data, not a shard
        return False, (f"needs each rank to draw its own shard: {_ranks(same)} drew rank 0's samples at every "
                       "step (see disjoint shards); then call sampler.set_epoch(epoch) every epoch.")
    unchanged = []
    for r in ev.ranks:
        first, second = sorted(epochs[r])[:2]
        if epochs[r][first] == epochs[r][second]:
            unchanged.append(r)
    if unchanged:
        return False, (f"{_ranks(unchanged)} drew the same samples in the same order in epochs 0 and 1: call "
                       "sampler.set_epoch(epoch) at the start of every epoch so each epoch is shuffled anew.")
    return True, "every rank drew its own samples in a new order each epoch."


def equal_parameters(ev: Evidence, a: Assignment) -> Outcome:
    initial = {r: ev.initials[r][0]["fingerprint"] for r in ev.ranks if ev.initials.get(r)}
    if len(initial) < a.world_size:
        idle = [r for r in ev.ranks if r not in initial]
        return _not_assessed(ev, f"needs every rank to train: {_took(idle)} (see ran to the end).")
    differ = [r for r in ev.ranks if not fingerprints_equal(initial[r], initial[0])]
    if differ:
        return False, (f"{_ranks(differ)} started from different parameters than rank 0: wrap the model in "
                       "DistributedDataParallel (it broadcasts rank 0's parameters) or broadcast them yourself.")
    steps = min(len(ev.steps.get(r, [])) for r in ev.ranks)
    for i in range(steps):
        differ = [r for r in ev.ranks if not fingerprints_equal(ev.steps[r][i]["fingerprint"],
                                                                 ev.steps[0][i]["fingerprint"])]
        if differ:
            return False, (f"after step {i + 1} the parameters of {_ranks(differ)} differ from rank 0's: every "
                           "rank must apply the same averaged gradient (DDP, or all_reduce the gradients) and "
                           "change its parameters in no other way (no per-rank random noise or re-initialisation).")
    needs = _needs_data_parallel(ev)
    if needs:
        return needs
    return True, (f"all ranks held identical parameters at the start and after each of {steps} steps, "
                  "each rank having trained on its own batches.")


def matches_single_process(ev: Evidence, a: Assignment) -> Outcome:
    needs = _needs_data_parallel(ev)
    if needs:
        return needs
    if ev.replay_error or not ev.comparisons:
        return False, f"the grader could not replay the first steps: {ev.replay_error or 'no steps recorded'}."
    for c in ev.comparisons:
        if c.relative_error <= a.gradient_tolerance:
            continue
        if abs(c.scale - a.world_size) < 0.05 * a.world_size:
            return False, (f"at step {c.step} rank 0's gradient was {c.scale:.2f}x the single-process gradient "
                           f"on the union batch: the gradients were summed, not averaged; divide by world_size.")
        return False, (f"at step {c.step} rank 0's gradient differs from single-process training on the union "
                       f"of the ranks' batches (relative error {c.relative_error:.2g}): the gradients were not "
                       "averaged across ranks, or the ranks did not start from the same parameters.")
    worst = max(c.relative_error for c in ev.comparisons)
    return True, (f"the first {len(ev.comparisons)} steps match one process training on the union of the "
                  f"{a.world_size} ranks' batches (relative error at most {worst:.1e}).")


# What notebook 02 (course.lr_scaling) teaches for a k-times bigger global batch: linear scaling (Goyal et al.
# 2017, for SGD) everywhere; the square-root rule too for Adam-family optimizers (Malladi et al. 2022).
ADAPTIVE_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "SparseAdam")


def lr_rules(optimizer: str | None) -> dict[str, Callable[[float], float]]:
    """The scaling rules the course accepts for ``optimizer`` (its class name): rule -> ``k -> factor``."""
    rules: dict[str, Callable[[float], float]] = {"linear": lambda k: k}
    if optimizer in ADAPTIVE_OPTIMIZERS:
        rules["square-root"] = math.sqrt
    return rules


def lr_scaled(ev: Evidence, a: Assignment) -> Outcome:
    alone, idle = [r for r in ev.ranks if not ev.inits.get(r)], _idle(ev)
    if 0 in idle:
        return _not_assessed(ev, "rank 0 took no optimizer step.")
    steps = ev.steps[0]
    if alone or idle:
        batch = len(steps[0]["indices"])
        why = (f"{_ranks(alone)} never joined a process group, so each process took its steps of {batch} "
               "samples alone (one process, nn.DataParallel included, is not the assignment)" if alone else
               f"{_took(idle)}, so no step averaged the ranks' batches")
        return _not_assessed(ev, f"needs a global batch to scale for: {why}; see ran to the end.")
    global_batch = sum(len(ev.steps[r][0]["indices"]) for r in ev.ranks)
    k = global_batch / a.base_batch_size
    optimizer = steps[0].get("optimizer")
    rules = {rule: a.base_lr * factor(k) for rule, factor in lr_rules(optimizer).items()}
    lrs = [s["lr"][0] for s in steps]
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


def rank0_checkpoint_and_logs(ev: Evidence, a: Assignment) -> Outcome:
    savers = [r for r in ev.ranks if ev.saves.get(r) or ev.writes.get(r)]
    if savers and savers != [0]:
        return False, (f"{_ranks(savers)} wrote files: save the checkpoint on rank 0 only (if rank.is_main), "
                       "or every rank overwrites the same file.")
    reporters = [r for r in ev.ranks if ev.reports.get(r)]
    printers = [r for r in ev.ranks if r != 0 and ev.exits.get(r, {}).get("stdout_bytes", 0) > 0]
    others = sorted({r for r in reporters if r != 0} | set(printers))
    if others:
        return False, (f"{_ranks(others)} printed or reported: "
                       "log on rank 0 only (if rank.is_main, or course.world.print0).")
    idle = _idle(ev)
    if not savers and (ev.status != "ok" or idle):
        return _not_assessed(ev, f"needs every rank to train: {_took(idle)} (see ran to the end).")
    if not savers and ev.test_accuracy is None:  # target_accuracy fails for it; this check is about who writes
        return True, (f"no rank wrote files and only rank 0 printed (no checkpoint was saved at {a.checkpoint}: "
                      "see target accuracy).")
    if not savers:
        return True, "no other rank wrote files or printed."
    return True, "only rank 0 wrote the checkpoint and printed."


def metrics_averaged(ev: Evidence, a: Assignment) -> Outcome:
    reports = ev.reports.get(0, [])
    if not reports:
        return _not_assessed(ev, "rank 0 never called report(epoch, train_loss, val_accuracy).")
    diverged = _diverged_at(ev)
    if diverged is not None:  # the ranks' accuracies are of different models: rank 0's says nothing of the mean
        reports = [r for r in reports if r.get("step", 0) < diverged]
        if not reports:
            return True, ("not assessed: the ranks held different parameters by the time rank 0 reported, so "
                          "the averaged accuracy cannot be compared with one model's (see equal parameters).")
    last = _report_of_checkpoint(ev, a)
    if last is not None and ev.checkpoint_val_accuracy is not None and last.get("val_accuracy") is not None \
            and abs(last["val_accuracy"] - ev.checkpoint_val_accuracy) > a.metric_tolerance:
        return False, (f"at epoch {last['epoch']:g} you reported val_accuracy {last['val_accuracy']:.4f}, but the "
                       f"checkpoint you saved right after scores {ev.checkpoint_val_accuracy:.4f} on the whole "
                       "validation set: all_reduce the correct counts (or accuracies) across ranks before reporting.")
    for r in reports:
        true = r.get("true_val_accuracy")
        if true is None or r.get("val_accuracy") is None:
            return False, "the grader could not compute the model's true validation accuracy at report()."
        if abs(r["val_accuracy"] - true) > a.metric_tolerance:
            return False, (f"at epoch {r['epoch']:g} you reported val_accuracy {r['val_accuracy']:.4f}, but the "
                           f"model's accuracy on the whole validation set was {true:.4f}: all_reduce the correct "
                           "counts (or accuracies) across ranks before reporting.")
    return True, f"all {len(reports)} reported validation accuracies match the whole validation set."


def _report_of_checkpoint(ev: Evidence, a: Assignment) -> dict | None:
    """Rank 0's last report made with the parameters the checkpoint holds (no step between), or None."""
    saved = _checkpoint_save(ev, a)
    reports = [r for r in ev.reports.get(0, []) if saved is not None and r.get("step") == saved.get("step")]
    return reports[-1] if reports else None


def _checkpoint_save(ev: Evidence, a: Assignment) -> dict | None:
    """Rank 0's last torch.save to the checkpoint path (the file the grader evaluated), or None."""
    saves = [s for s in ev.saves.get(0, []) if str(s.get("path", "")).endswith(a.checkpoint)]
    return saves[-1] if saves else None


def _trained_epochs(ev: Evidence) -> dict[int, int]:
    """How many passes over the training data each rank took optimizer steps in."""
    return {r: len(ev.epochs(r)) for r in ev.ranks}


def target_accuracy(ev: Evidence, a: Assignment) -> Outcome:
    over = {r: n for r, n in _trained_epochs(ev).items() if n > a.epochs}
    if over:
        return False, (f"{_ranks(sorted(over))} trained {max(over.values())} epochs; the budget is {a.epochs}: "
                       f"the 4-GPU script must reach the target in the starter's {a.epochs} epochs (each epoch "
                       "is now 4x fewer steps; scale the learning rate instead of training longer).")
    if ev.test_accuracy is None:
        return _not_assessed(ev, ev.checkpoint_error or f"no checkpoint at {a.checkpoint} to evaluate.")
    if ev.test_accuracy < a.target_accuracy:
        return False, (f"your checkpoint scored {ev.test_accuracy:.3f} on held-out data; the target is "
                       f"{a.target_accuracy:.2f}.")
    return True, (f"your checkpoint scored {ev.test_accuracy:.3f} on held-out data the grader kept to itself "
                  f"(target {a.target_accuracy:.2f}).")


def integrity(ev: Evidence, a: Assignment) -> Outcome:
    tampered = sorted({t["name"] for r in ev.ranks for t in ev.tampers.get(r, [])})
    if tampered:
        return False, f"the submission replaced {', '.join(tampered)}; the grader measures what really happened."
    forged = [f for r in ev.ranks for f in ev.forgeries.get(r, [])]
    if forged:
        kinds = ", ".join(sorted({str(f.get("forged_kind")) for f in forged}))
        return False, (f"the submission called the grader's probes itself ({len(forged)} {kinds} record(s) "
                       f"through {forged[0].get('via')}); they were not believed.")
    if ev.rejected_records or ev.misattributed:
        return False, (f"{ev.rejected_records + ev.misattributed} forged lines were written to the grader's "
                       "record channel; they were refused.")
    mismatch = _records_disagree_with_checkpoint(ev, a)
    if mismatch:
        return False, mismatch + " The grader's records of this run cannot be trusted."
    bound = ", and their records agree with the checkpoint" if ev.checkpoint_step is not None else ""
    return True, f"the grader's probes were left alone{bound}."


def _records_disagree_with_checkpoint(ev: Evidence, a: Assignment) -> str | None:
    """Why rank 0's records do not describe the checkpoint the grader evaluated, or None if they do."""
    saved = _checkpoint_save(ev, a)
    if saved is None or ev.checkpoint_fingerprint is None:
        return None
    step = saved.get("step", 0)
    recorded = (ev.initials.get(0) or [{}])[0] if step == 0 else next(
        (s for s in ev.steps.get(0, []) if s.get("step") == step), {})
    if "fingerprint" in recorded and not fingerprints_equal(recorded["fingerprint"], ev.checkpoint_fingerprint):
        return f"the checkpoint's parameters are not those rank 0's optimizer held after step {step}."
    report = _report_of_checkpoint(ev, a)
    true = report.get("true_val_accuracy") if report else None
    if true is not None and ev.checkpoint_val_accuracy is not None \
            and abs(true - ev.checkpoint_val_accuracy) > a.metric_tolerance:
        return (f"a report record says the model's validation accuracy was {true:.4f}; the checkpoint saved "
                f"right after scores {ev.checkpoint_val_accuracy:.4f}.")
    return None


CHECKS: tuple[Check, ...] = (
    Check("ran_to_the_end", "ran on 4 ranks to the end", 10, "visible", ran_to_the_end),
    Check("disjoint_shards", "disjoint shards covering the data", 15, "visible", disjoint_shards),
    Check("reshuffled", "reshuffled every epoch", 10, "visible", reshuffled),
    Check("equal_parameters", "equal parameters at start and after every step", 15, "visible", equal_parameters),
    Check("matches_single_process", "matches one process on the union batch", 15, "visible",
          matches_single_process),
    Check("lr_scaled", "learning rate scaled, with warmup", 10, "visible", lr_scaled),
    Check("rank0_checkpoint_and_logs", "checkpoint and logs on rank 0 only", 10, "visible",
          rank0_checkpoint_and_logs),
    Check("metrics_averaged", "metrics averaged across ranks", 5, "visible", metrics_averaged),
    Check("target_accuracy", "target accuracy reached", 10, "visible", target_accuracy),
    Check("integrity", "grader's probes untouched", 0, "hidden", integrity, voids_score=True),
)
