"""The integrity check: the grader's probes were left alone and their records agree with what it measured.

Failed, it withholds the whole score (``voids_score``): every other check rests on these records. A rank's
process can sign records as that rank (see :mod:`grader.inrank.channel`), so where its records can be checked
against what the grader measured itself (the checkpoint's parameters and validation accuracy), they are.
"""

from __future__ import annotations

from grader.assignment import Assignment
from grader.checks.common import Finding, checkpoint_save, checkpoint_step, report_of_checkpoint
from grader.evidence import Evidence, fingerprints_equal


def integrity(ev: Evidence, a: Assignment) -> Finding:
    tampered = sorted({t.name for r in ev.ranks for t in ev.tampers.get(r, ())})
    if tampered:
        return False, f"the submission replaced {', '.join(tampered)}; the grader measures what really happened."
    forged = [f for r in ev.ranks for f in ev.forgeries.get(r, ())]
    if forged:
        kinds = ", ".join(sorted({str(f.forged_kind) for f in forged}))
        return False, (f"the submission called the grader's probes itself ({len(forged)} {kinds} record(s) "
                       f"through {forged[0].via}); they were not believed.")
    if ev.malformed:
        return False, (f"{len(ev.malformed)} record(s) on the grader's record channel did not fit the record "
                       f"format and were refused (the first: {ev.malformed[0].rstrip('.')}); the grader's probes "
                       "write only well-formed records.")
    if ev.rejected_records or ev.misattributed:
        return False, (f"{ev.rejected_records + ev.misattributed} forged lines were written to the grader's "
                       "record channel; they were refused.")
    if ev.checkpoint_foreign:
        return False, (f"{a.checkpoint} holds parameters that rank 0's recorded optimizer steps did not produce "
                       f"({ev.checkpoint_error}) The run is kept for the instructor's review.")
    mismatch = _records_disagree_with_checkpoint(ev, a)
    if mismatch:
        return False, mismatch + " The grader's records of this run cannot be trusted."
    bound = ", and their records agree with the checkpoint" if ev.checkpoint_step is not None else ""
    return True, f"the grader's probes were left alone{bound}."


def _records_disagree_with_checkpoint(ev: Evidence, a: Assignment) -> str | None:
    """Why rank 0's records do not describe the checkpoint the grader evaluated, or None if they do."""
    step = checkpoint_step(ev, a)
    if checkpoint_save(ev, a) is None or step is None or ev.checkpoint_fingerprint is None \
            or ev.checkpoint_relation is not None:  # an average of the recorded weights: no one step's
        return None
    recorded = (ev.initials.get(0) or (None,))[0] if step == 0 else next(
        (s for s in ev.steps.get(0, ()) if s.step == step), None)
    if recorded is not None and not fingerprints_equal(recorded.fingerprint, ev.checkpoint_fingerprint):
        return f"the checkpoint's parameters are not those rank 0's optimizer held after step {step}."
    report = report_of_checkpoint(ev, a)
    true = report.true_val_accuracy if report else None
    if true is not None and ev.checkpoint_val_accuracy is not None \
            and abs(true - ev.checkpoint_val_accuracy) > a.metric_tolerance:
        return (f"a report record says the model's validation accuracy was {true:.4f}; the checkpoint saved "
                f"right after scores {ev.checkpoint_val_accuracy:.4f}.")
    return None
