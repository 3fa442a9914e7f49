"""What several checks ask of the evidence, and how they name ranks: shared by :mod:`grader.checks`' modules."""

from __future__ import annotations

from grader.assignment import Assignment
from grader.evidence import Evidence, fingerprints_equal
from grader.inrank.records import Report, Save

Finding = tuple[bool | None, str]  # what one check found: passed (None: cannot be assessed on this finished
# run), and the message saying why


def cannot_assess(why: str) -> Finding:
    """The run finished but cannot show this check's evidence: neither points nor a penalty (the check's points
    are left out of the total), and ``why`` said."""
    return None, f"cannot be assessed: {why}"


def ranks_text(ranks: list[int]) -> str:
    """``rank 2``, ``ranks 1, 3``, ``ranks 1–3``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def took(ranks: list[int]) -> str:
    return f"{ranks_text(ranks)} took no optimizer step"


def not_assessed(ev: Evidence, advice: str) -> Finding:
    """A failure for lack of evidence: ``advice`` if the run finished, else "not assessed" and no advice
    (what was never seen is the crash's doing, which the run's status names)."""
    if ev.status != "ok":
        return False, f"not assessed: the run did not finish ({ev.status}); see the run's status above."
    return False, advice


def unseen_ranks(ev: Evidence) -> str:
    """Why the grader cannot tell what some ranks trained on ('' when it can): the ranks whose optimizer steps
    came with no training sample the grader recognised, neither in a DataLoader over data.load().train nor in
    what their model consumed (inputs changed before the forward, e.g. augmented, are not recognised)."""
    unseen = [r for r in ev.ranks if ev.steps.get(r) and not any(s.indices for s in ev.steps[r])]
    if not unseen:
        return ""
    return (f"the grader could not tell which training samples {ranks_text(unseen)} trained on: it recognises "
            "the samples of data.load().train in what the model receives, and these inputs were not among them "
            "(changed before the forward, e.g. augmented?). So it cannot say whether the ranks' data differed.")


def idle_ranks(ev: Evidence) -> list[int]:
    """Ranks that took no optimizer step."""
    return [r for r in ev.ranks if not ev.steps.get(r)]


def copies_of_rank0(ev: Evidence) -> list[int]:
    """Ranks other than 0 that fetched exactly rank 0's samples at every step both took (so whatever they did,
    their parameters stay rank 0's: their equality shows nothing about averaging)."""
    def batches(r: int) -> list[list[int]]:
        return [sorted(s.indices) for s in ev.steps.get(r, ())]
    mine = batches(0)
    return [r for r in ev.ranks if r != 0 and mine and batches(r)
            and all(a == b for a, b in zip(batches(r), mine, strict=False))]


def needs_data_parallel(ev: Evidence) -> Finding | None:
    """Why the run cannot show gradients averaged across ranks that saw different data (what the check needs,
    as a failure), or None when it can."""
    alone = [r for r in ev.ranks if not ev.inits.get(r)]
    idle = idle_ranks(ev)
    if alone or idle:
        if alone:
            advice = (f"needs the ranks to join one process group: {ranks_text(alone)} never did, so each "
                      "process trained alone and nothing was averaged across processes (one process, "
                      "nn.DataParallel included, is not the assignment): see ran to the end.")
        else:
            advice = (f"needs every rank to train: {took(idle)}, so no step combined the ranks' batches "
                      "(the union batch is the training ranks' alone): see ran to the end.")
        return not_assessed(ev, advice)
    unseen = unseen_ranks(ev)
    if unseen:
        return cannot_assess(unseen)
    same = copies_of_rank0(ev)
    if same:
        return cannot_assess(f"needs each rank to see its own shard: {ranks_text(same)} trained on rank 0's "
                             "batches at every step, so they stay equal to rank 0 whether or not gradients are "
                             "averaged (see disjoint shards).")
    return None


def diverged_at(ev: Evidence) -> int | None:
    """The first step after which some rank's parameters differed from rank 0's (0: from the start), or None."""
    initial = {r: ev.initials[r][0].fingerprint for r in ev.ranks if ev.initials.get(r)}
    if 0 in initial and any(not fingerprints_equal(f, initial[0]) for f in initial.values()):
        return 0
    steps = min((len(ev.steps.get(r, ())) for r in ev.ranks), default=0)
    for i in range(steps):
        if any(not fingerprints_equal(ev.steps[r][i].fingerprint, ev.steps[0][i].fingerprint)
               for r in ev.ranks):
            return i + 1
    return None


def checkpoint_save(ev: Evidence, a: Assignment) -> Save | None:
    """Rank 0's last torch.save to the checkpoint path (the file the grader evaluated), or None."""
    saves = [s for s in ev.saves.get(0, ()) if s.path.endswith(a.checkpoint)]
    return saves[-1] if saves else None


def checkpoint_step(ev: Evidence, a: Assignment) -> int | None:
    """The rank-0 step whose parameters the checkpoint holds: the one the grader bound it to, else (not bound)
    the step rank 0 had taken when it saved it; None without a checkpoint."""
    if ev.checkpoint_step is not None:
        return ev.checkpoint_step
    saved = checkpoint_save(ev, a)
    return saved.step if saved is not None else None


def last_step(ev: Evidence) -> int | None:
    """Rank 0's last recorded optimizer step, or None."""
    steps = ev.steps.get(0, ())
    return steps[-1].step if steps else None


def report_of_checkpoint(ev: Evidence, a: Assignment) -> Report | None:
    """Rank 0's last report made with the parameters the checkpoint holds (no step between), or None (also
    when the checkpoint averages several steps' weights: no report was made with them)."""
    if ev.checkpoint_relation is not None:
        return None
    step = checkpoint_step(ev, a)
    reports = [r for r in ev.reports.get(0, ()) if step is not None and r.step == step]
    return reports[-1] if reports else None
