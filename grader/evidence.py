"""What a graded run left behind, sorted by rank: the probes' records, the ranks' exits, the checkpoint's score.

:func:`collect` turns the verified records of one run into an :class:`Evidence` the checks read. Nothing
here comes from the student's printed output. Used by the grader of notebook 06.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from course import data
from grader import channel, probes, replay


@dataclass
class Evidence:
    """Everything the checks may look at, for one run of one submission.

    Attributes:
        world_size: ranks the grader started.
        train_size: samples in the training split.
        expected_backend: ``nccl`` on GPUs, ``gloo`` on emulated ones.
        status: how the run ended (``ok``, ``timeout``, ``hang on rank 3``, ...), see :mod:`grader.runner`.
        steps, inits, ends, reports, saves, writes, collectives, tampers, shutdowns, forgeries: the probes'
            records per rank, in order (``forgeries``: calls into the probes from outside the grader).
        exits: the launcher's record of each rank's exit code, output size and output.
        test_accuracy: the grader's own evaluation of the checkpoint (perturbed test split), or None.
        checkpoint_val_accuracy: the checkpoint's accuracy on the whole validation split, by the grader.
        checkpoint_fingerprint: the checkpoint's parameter fingerprint, computed by the grader as the probes do.
        checkpoint_error: why the checkpoint could not be evaluated, or was not (see :func:`bind_checkpoint`).
        checkpoint_step: the rank-0 optimizer step after which rank 0 held the checkpoint's parameters, or
            None when no recorded step did (then ``test_accuracy`` is None).
        comparisons: rank 0's first gradients against the single-process union-batch gradients.
        replay_error: why the replay could not run, or None.
        rejected_records: lines on the record channel refused (no valid signature, or out of sequence).
        misattributed: signed records claiming to come from someone other than their signer (ignored).
    """

    world_size: int
    expected_backend: str
    train_size: int = 0
    status: str = "ok"
    steps: dict[int, list[dict]] = field(default_factory=dict)
    inits: dict[int, list[dict]] = field(default_factory=dict)
    ends: dict[int, list[dict]] = field(default_factory=dict)
    reports: dict[int, list[dict]] = field(default_factory=dict)
    saves: dict[int, list[dict]] = field(default_factory=dict)
    writes: dict[int, list[dict]] = field(default_factory=dict)
    collectives: dict[int, list[dict]] = field(default_factory=dict)
    tampers: dict[int, list[dict]] = field(default_factory=dict)
    shutdowns: dict[int, list[dict]] = field(default_factory=dict)
    initials: dict[int, list[dict]] = field(default_factory=dict)
    forgeries: dict[int, list[dict]] = field(default_factory=dict)
    exits: dict[int, dict] = field(default_factory=dict)
    last_record: dict[int, dict] = field(default_factory=dict)
    test_accuracy: float | None = None
    checkpoint_val_accuracy: float | None = None
    checkpoint_fingerprint: list[float] | None = None
    checkpoint_error: str | None = None
    checkpoint_step: int | None = None
    comparisons: list[replay.Comparison] = field(default_factory=list)
    replay_error: str | None = None
    rejected_records: int = 0
    misattributed: int = 0

    @property
    def ranks(self) -> range:
        return range(self.world_size)

    def epochs(self, rank: int) -> dict[int, list[int]]:
        """Training-sample indices ``rank`` fetched, by epoch (the order it fetched them in)."""
        by_epoch: dict[int, list[int]] = defaultdict(list)
        for step in self.steps.get(rank, []):
            by_epoch[step["epoch"]].extend(step["indices"])
        return dict(by_epoch)


_KINDS = {"step": "steps", "init": "inits", "end": "ends", "report": "reports", "save": "saves",
          "write": "writes", "collective": "collectives", "tamper": "tampers", "shutdown": "shutdowns",
          "initial": "initials", "forgery": "forgeries"}


def collect(records: list[dict[str, Any]], world_size: int, expected_backend: str) -> Evidence:
    """Sort verified records by kind and rank; ranks outside ``0..world_size-1`` are ignored.

    A record's ``signer`` (see :class:`grader.channel.Reader`) must fit it: exit records come from the
    launcher, every other record from the rank it names (or the launcher, which holds every key). Others
    are counted in ``misattributed``, not used.
    """
    evidence = Evidence(world_size, expected_backend)
    for record in records:
        rank = record.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            continue
        kind = record.get("kind")
        signers = (channel.LAUNCHER,) if kind == "rank_exit" else (rank, channel.LAUNCHER)
        if record.get("signer", channel.LAUNCHER) not in signers:
            evidence.misattributed += 1
        elif kind == "rank_exit":
            evidence.exits[rank] = record
        elif kind in _KINDS:
            getattr(evidence, _KINDS[kind]).setdefault(rank, []).append(record)
            evidence.last_record[rank] = record
    return evidence


def bind_checkpoint(evidence: Evidence, checkpoint_digests: list[str] | None, checkpoint: str) -> bool:
    """Is the checkpoint the model rank 0's optimizer trained? Sets ``checkpoint_step``, or says why not.

    The checkpoint's parameter tensors (:func:`grader.probes.digests`, in any order) must be, bit for bit,
    those rank 0's optimizer held after one of its recorded steps (normally the last), and every step up to
    that one must have started from the parameters the step before it left: the model was changed by
    recorded optimizer steps only. Whatever the script did to ``torch.save``, the probes or its model,
    parameters that this chain of steps did not produce (a second model, trained by hand or by another
    optimizer; weights copied in, averaged, perturbed or edited outside ``optimizer.step()``) are not graded:
    on False ``checkpoint_error`` says why and the caller must not use the checkpoint's scores.
    """
    steps = [s for s in evidence.steps.get(0, []) if s.get("digests")]
    if not steps:
        evidence.checkpoint_error = ("no optimizer step was recorded on rank 0, so there is no trained model to "
                                     f"evaluate: train with a torch.optim optimizer, then save {checkpoint}.")
        return False
    held = sorted(checkpoint_digests or [])
    match = [i for i, s in enumerate(steps) if sorted(s["digests"]) == held]
    if match:
        chain = zip(steps[:match[-1]], steps[1:match[-1] + 1], strict=True)  # (step, the step after it)
        broken = next((after for before, after in chain if after.get("digests_before") != before["digests"]), None)
        if broken is None:
            evidence.checkpoint_step = steps[match[-1]]["step"]
            return True
        evidence.checkpoint_error = (
            f"rank 0's parameters changed between its optimizer steps {broken['step'] - 1} and {broken['step']}, "
            f"outside optimizer.step() (or another optimizer took over): the grader evaluates only a model that "
            "your recorded training produced step by step. Change the parameters only through the optimizer "
            "(no copying weights in, no added noise, no re-initialisation).")
        return False
    last = steps[-1]
    ends = [e for e in evidence.ends.get(0, []) if e.get("digests")]
    changed = bool(ends) and sorted(ends[-1]["digests"]) != sorted(last["digests"])
    evidence.checkpoint_error = (
        f"{checkpoint} does not hold the parameters rank 0's optimizer produced: they differ from those after "
        f"each of its {len(steps)} recorded steps (the last: step {last['step']})"
        + (", and rank 0's parameters changed after that step, outside optimizer.step()" if changed else "")
        + ". The grader evaluates only the model your training produced: save model.state_dict() on rank 0 "
        "right after the last optimizer step, and change the parameters in no other way.")
    return False


def replay_first_steps(evidence: Evidence) -> None:
    """Fill ``evidence.comparisons`` from rank 0's full records of its first steps (or say why not)."""
    full = [s for s in evidence.steps.get(0, []) if "grads" in s]
    if not full:
        evidence.replay_error = "no optimizer step was recorded on rank 0"
        return
    try:
        train = None
        for step in full:
            number = step["step"]
            indices = [_step(evidence, rank, number).get("indices", []) for rank in evidence.ranks]
            if not any(indices):
                raise ValueError(f"no training samples were fetched through data.load().train for step {number}")
            train = train or data.load().train
            reference = replay.union_batch_gradient(probes.decode(step["params_before"]), step["shapes"],
                                                    indices, train)
            evidence.comparisons.append(replay.compare(number, probes.decode(step["grads"]), reference))
    except (ValueError, RuntimeError, KeyError, IndexError) as error:
        evidence.replay_error = str(error)


def _step(evidence: Evidence, rank: int, number: int) -> dict:
    for step in evidence.steps.get(rank, []):
        if step["step"] == number:
            return step
    return {}


def fingerprints_equal(a: list[float], b: list[float]) -> bool:
    """Parameter fingerprints equal up to float rounding (ranks summing in different orders)."""
    if len(a) != len(b):
        return False
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return bool(((x - y).abs() <= 1e-5 * (x.abs() + y.abs()) + 1e-6).all())
