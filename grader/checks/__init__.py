"""The checks, declared in one place: each has points, a visibility and a message in the course's terms.

A check reads only the :class:`~grader.evidence.Evidence` of a run (the trusted probes' records and the
grader's own evaluation) and returns whether it passed and what to tell the student. ``CHECKS`` is the
whole rubric; the self-check (``grader check``) runs the ``visible`` ones. Every check is proven by a
submission in ``tests/submissions/`` that must fail it alone. Where a rank's records can be checked against
what the grader measured itself (the checkpoint's parameters and validation accuracy), they are: a rank's
process can sign records as that rank (see :mod:`grader.inrank.channel`), so forging one gains nothing.

A check credits only the behaviour its title names, seen happening: ranks that all train on rank 0's batches stay
identical with or without averaging, so equal parameters show nothing there, and the check fails saying what it
needs ("needs each rank to see its own shard: see disjoint shards"). When the run did not finish, a check left
without its evidence says "not assessed" and gives no advice (the run's status says what happened). A failed
check declared ``voids_score`` (integrity) withholds the whole score, see :class:`grader.results.Results`.
"""

from __future__ import annotations

from grader.checks.integrity import integrity
from grader.checks.outputs import metrics_averaged, rank0_checkpoint_and_logs, target_accuracy
from grader.checks.training import (  # noqa: F401  (lr_rules, ADAPTIVE_OPTIMIZERS: the rules notebook 02 teaches)
    ADAPTIVE_OPTIMIZERS,
    disjoint_shards,
    equal_parameters,
    lr_rules,
    lr_scaled,
    matches_single_process,
    ran_to_the_end,
    reshuffled,
)
from grader.results import Check  # one line of the rubric: name, title, points, visibility, test, voids_score

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
