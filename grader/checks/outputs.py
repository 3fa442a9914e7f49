"""Checks of what the run left behind: files and logs from rank 0 only, averaged metrics, the target accuracy."""

from __future__ import annotations

from course.runtime import collective_names
from grader.assignment import Assignment
from grader.checks.common import (
    Finding,
    cannot_assess,
    checkpoint_step,
    diverged_at,
    idle_ranks,
    last_step,
    not_assessed,
    ranks_text,
    report_of_checkpoint,
    took,
)
from grader.evidence import Evidence
from grader.inrank.records import Report


def _combines(op: str) -> bool:
    """The collective ``op`` (a torch name or an operation) combines the ranks' values (a broadcast or a barrier
    does not): the one table, :mod:`course.runtime.collective_names`, says."""
    try:
        return collective_names.of(op).combines
    except KeyError:
        return op in collective_names.COMBINING


def rank0_checkpoint_and_logs(ev: Evidence, a: Assignment) -> Finding:
    savers = [r for r in ev.ranks if ev.saves.get(r) or ev.writes.get(r)]
    if savers and savers != [0]:
        return False, (f"{ranks_text(savers)} wrote files: save the checkpoint on rank 0 only (if rank.is_main), "
                       "or every rank overwrites the same file.")
    reporters = [r for r in ev.ranks if ev.reports.get(r)]
    printers = [r for r, e in ev.exits.items() if r != 0 and e.stdout_bytes > 0]
    others = sorted({r for r in reporters if r != 0} | set(printers))
    if others:
        return False, (f"{ranks_text(others)} printed or reported: "
                       "log on rank 0 only (if rank.is_main, or course.world.print0).")
    idle = idle_ranks(ev)
    if not savers and (ev.status != "ok" or idle):
        return not_assessed(ev, f"needs every rank to train: {took(idle)} (see ran to the end).")
    if not savers and ev.test_accuracy is None:  # target_accuracy fails for it; this check is about who writes
        return True, (f"no rank wrote files and only rank 0 printed (no checkpoint was saved at {a.checkpoint}: "
                      "see target accuracy).")
    if not savers:
        return True, "no other rank wrote files or printed."
    return True, "only rank 0 wrote the checkpoint and printed."


def metrics_averaged(ev: Evidence, a: Assignment) -> Finding:
    reports = ev.reports.get(0, ())
    if not reports:
        return not_assessed(ev, "rank 0 never called report(epoch, train_loss, val_accuracy).")
    diverged = diverged_at(ev)
    if diverged is not None:  # the ranks' accuracies are of different models: rank 0's says nothing of the mean
        reports = [r for r in reports if r.step < diverged]
        if not reports:
            return cannot_assess("the ranks held different parameters by the time rank 0 reported, so the "
                                 "averaged accuracy cannot be compared with one model's (see equal parameters).")
    last = report_of_checkpoint(ev, a)
    if last is not None and ev.checkpoint_val_accuracy is not None and last.val_accuracy is not None \
            and abs(last.val_accuracy - ev.checkpoint_val_accuracy) > a.metric_tolerance:
        return False, (f"at epoch {last.epoch:g} you reported val_accuracy {last.val_accuracy:.4f}, but the "
                       f"checkpoint you saved right after scores {ev.checkpoint_val_accuracy:.4f} on the whole "
                       f"validation set. {SHARDED_METRICS}")
    for r in reports:
        true = r.true_val_accuracy
        if true is None or r.val_accuracy is None:
            return False, "the grader could not compute the model's true validation accuracy at report()."
        if abs(r.val_accuracy - true) > a.metric_tolerance:
            return False, (f"at epoch {r.epoch:g} you reported val_accuracy {r.val_accuracy:.4f}, but the "
                           f"model's accuracy on the whole validation set was {true:.4f}. {SHARDED_METRICS}")
    # the numbers are right; were they combined across ranks? (one rank training alone has nothing to reduce)
    training = [r for r in ev.ranks if ev.inits.get(r) and ev.steps.get(r)]
    unreduced = next((r for r in reports if not _reduced_before(ev, r)), None) if len(training) > 1 else None
    if unreduced is not None:
        return False, (f"at epoch {unreduced.epoch:g} rank 0 reported without combining anything across ranks "
                       "since its last optimizer step: no all_reduce, reduce or all_gather, and no messages that "
                       f"brought every rank's numbers to rank 0. {SHARDED_METRICS}")
    return True, f"all {len(reports)} reported validation accuracies match the whole validation set."


# how to average a metric across ranks, without the repeated samples DistributedSampler pads shards with
SHARDED_METRICS = ("Give each rank its own part of the validation set, with no sample twice: "
                   "dataset[rank::world_size] does this (DistributedSampler pads with repeats). "
                   "Count the correct answers and the samples on each rank. "
                   "Sum both counts across ranks with all_reduce, then divide (notebook 05, step 6).")


def _reduced_before(ev: Evidence, report: Report) -> bool:
    """Rank 0 combined the ranks' numbers after its last optimizer step and before ``report`` (and after its
    previous report): it called a reduction itself (not torch's internals: FSDP's gathers, ZeRO's broadcasts), or
    point-to-point messages reached it from every other rank (a ring or a tree allreduce, the course's own)."""
    earlier = [r.seq for r in ev.reports.get(0, ()) if r.seq is not None and report.seq is not None
               and r.seq < report.seq]
    after = max(earlier, default=-1)

    def in_window(record) -> bool:
        return record.seq is None or report.seq is None or after < record.seq < report.seq

    if any(_combines(c.op) and not c.by_torch and c.step == report.step and in_window(c)
           for c in ev.collectives.get(0, ())):
        return True
    messages = {r: [m for m in ev.messages.get(r, ()) if m.step == report.step and (r != 0 or in_window(m))]
                for r in ev.ranks}
    return _every_rank_reaches(0, messages, ev.world_size)


def _every_rank_reaches(root: int, messages: dict, world_size: int) -> bool:
    """Whether messages, matched (sent by one rank and received from it by the other), carry something from every
    rank to ``root``: a rank reaches it if it sent to ``root`` or to a rank that reaches it."""
    sent = {r: {peer for m in ms for peer in m.sent_to} for r, ms in messages.items()}
    received = {r: {peer for m in ms for peer in m.received_from} for r, ms in messages.items()}
    edges = {(a, b) for a in sent for b in sent[a] if a in received.get(b, set())}
    reached, grown = {root}, True
    while grown:
        more = {a for a, b in edges if b in reached} - reached
        reached |= more
        grown = bool(more)
    return reached >= set(range(world_size))


def _trained_epochs(ev: Evidence) -> dict[int, int]:
    """How many passes over the training data each rank took optimizer steps in."""
    return {r: len(ev.epochs(r)) for r in ev.ranks}


def target_accuracy(ev: Evidence, a: Assignment) -> Finding:
    over = {r: n for r, n in _trained_epochs(ev).items() if n > a.epochs}
    if over:
        return False, (f"{ranks_text(sorted(over))} trained {max(over.values())} epochs; the budget is {a.epochs}: "
                       f"the 4-GPU script must reach the target in the starter's {a.epochs} epochs (each epoch "
                       "is now 4x fewer steps; scale the learning rate instead of training longer).")
    if ev.test_accuracy is None:
        return not_assessed(ev, ev.checkpoint_error or f"no checkpoint at {a.checkpoint} to evaluate.")
    held, last = checkpoint_step(ev, a), last_step(ev)
    relation = f"your checkpoint is {ev.checkpoint_relation}, graded as your model: it" \
        if ev.checkpoint_relation else "your checkpoint"
    if held is not None and last is not None and held < last:
        epoch = _epoch_ended_at(ev, held)
        if epoch is None:
            return False, (f"your checkpoint holds the parameters rank 0 had after step {held}, not after its last "
                           f"step {last}: it is not the final model. Save model.state_dict() on rank 0 after the "
                           f"last optimizer step. (That older model scored {ev.test_accuracy:.3f} on held-out data.)")
        relation = (f"your checkpoint holds rank 0's weights at the end of epoch {epoch} (step {held} of {last}: "
                    "an earlier epoch's model, such as the best one), graded as your model: it")
    if ev.test_accuracy < a.target_accuracy:
        return False, (f"{relation} scored {ev.test_accuracy:.3f} on held-out data; the target is "
                       f"{a.target_accuracy:.2f}. {HELD_OUT}")
    return True, (f"{relation} scored {ev.test_accuracy:.3f} on held-out data the grader kept to itself "
                  f"(target {a.target_accuracy:.2f}). {HELD_OUT}")


def _epoch_ended_at(ev: Evidence, step: int) -> int | None:
    """The epoch rank 0's ``step`` ended, or None when it ended none (a step in the middle of an epoch)."""
    steps = list(ev.steps.get(0, ()))
    at = next((i for i, s in enumerate(steps) if s.step == step), None)
    if at is None or at + 1 >= len(steps) or steps[at + 1].epoch == steps[at].epoch:
        return None
    return steps[at].epoch


# why `grader check` and the class grade print different accuracies for one script (grader.evaluate, grader.secret)
HELD_OUT = ("The held-out digits are jittered with a seed drawn from the submission and the grading machine's "
            "secret, so `grader check` on your machine and the class grade score slightly different copies: "
            "expect their accuracies to differ by a point or two.")
