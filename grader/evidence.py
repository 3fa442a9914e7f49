"""What a graded run left behind, sorted by rank: the probes' records, the ranks' exits, the checkpoint's score.

Built in two frozen stages, nothing changed afterwards:

    records = collect(reader.result(), world_size=4, rejected_records=reader.rejected)   # RunRecords
    status, detail = runner._status(records, ...)               # how the run ended, from the records
    evidence = Evidence.of(records, expected_backend="gloo", status=status, train_size=1197,
                           checkpoint=judge_checkpoint(records, verdict, "checkpoint.pt"),
                           replay=replay_first_steps(records))

The records are typed (:mod:`grader.inrank.records`, the one declaration of their format); the checks
(:mod:`grader.checks`) read only an :class:`Evidence`. Nothing here comes from the student's printed output.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import torch

from course import data
from grader import averages, replay
from grader.inrank import channel, fingerprints
from grader.inrank.records import Call as CallRecord
from grader.inrank.records import Collective as CollectiveRecord
from grader.inrank.records import (
    End,
    Forgery,
    Init,
    Initial,
    MalformedRecord,
    Messages,
    ProbeError,
    RankExit,
    Record,
    Report,
    Save,
    Shutdown,
    Step,
    Tamper,
    Wait,
    Write,
    parse,
)

# RunRecords attribute -> the record kind it holds, per rank, in order
_BY_KIND = {"steps": Step, "inits": Init, "ends": End, "reports": Report, "saves": Save, "writes": Write,
            "collectives": CollectiveRecord, "tampers": Tamper, "shutdowns": Shutdown, "initials": Initial,
            "forgeries": Forgery, "probe_errors": ProbeError, "calls": CallRecord, "messages": Messages,
            "waits": Wait}


@dataclass(frozen=True, kw_only=True)
class RunRecords:
    """The verified records of one run, by kind and rank (frozen: mappings are read-only, lists are tuples).

    Attributes:
        world_size: ranks the grader started.
        steps, inits, ends, reports, saves, writes, collectives, tampers, shutdowns, initials, forgeries,
            probe_errors, calls, messages: the probes' records per rank, in order (``forgeries``: calls into the
            probes from outside the grader; ``probe_errors``: the grader's own code failed in the rank's process;
            ``messages``: the point-to-point messages each rank sent and received, a record per stretch;
            ``waits``: each wait for point-to-point messages, written as it began).
        exits: the launcher's record of each rank's exit code, output size and output.
        last_record: each rank's last record (of the kinds above).
        rejected_records: lines on the record channel refused (no valid signature, or out of sequence).
        misattributed: signed records claiming to come from someone other than their signer (ignored).
        malformed: why each signed record that did not fit the format (:func:`grader.inrank.records.parse`) was refused.
    """

    world_size: int
    steps: Mapping[int, tuple[Step, ...]] = field(default_factory=dict)
    inits: Mapping[int, tuple[Init, ...]] = field(default_factory=dict)
    ends: Mapping[int, tuple[End, ...]] = field(default_factory=dict)
    reports: Mapping[int, tuple[Report, ...]] = field(default_factory=dict)
    saves: Mapping[int, tuple[Save, ...]] = field(default_factory=dict)
    writes: Mapping[int, tuple[Write, ...]] = field(default_factory=dict)
    collectives: Mapping[int, tuple[CollectiveRecord, ...]] = field(default_factory=dict)
    tampers: Mapping[int, tuple[Tamper, ...]] = field(default_factory=dict)
    shutdowns: Mapping[int, tuple[Shutdown, ...]] = field(default_factory=dict)
    initials: Mapping[int, tuple[Initial, ...]] = field(default_factory=dict)
    forgeries: Mapping[int, tuple[Forgery, ...]] = field(default_factory=dict)
    probe_errors: Mapping[int, tuple[ProbeError, ...]] = field(default_factory=dict)
    calls: Mapping[int, tuple[CallRecord, ...]] = field(default_factory=dict)
    messages: Mapping[int, tuple[Messages, ...]] = field(default_factory=dict)
    waits: Mapping[int, tuple[Wait, ...]] = field(default_factory=dict)
    exits: Mapping[int, RankExit] = field(default_factory=dict)
    last_record: Mapping[int, Record] = field(default_factory=dict)
    rejected_records: int = 0
    misattributed: int = 0
    malformed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in (*_BY_KIND, "exits", "last_record"):  # read-only views of copies: nothing can change them
            value = getattr(self, name)
            frozen = {r: tuple(v) for r, v in value.items()} if name in _BY_KIND else dict(value)
            object.__setattr__(self, name, MappingProxyType(frozen))
        object.__setattr__(self, "malformed", tuple(self.malformed))

    @property
    def ranks(self) -> range:
        return range(self.world_size)

    def epochs(self, rank: int) -> dict[int, list[int]]:
        """Training-sample indices ``rank`` fetched, by epoch (the order it fetched them in)."""
        by_epoch: dict[int, list[int]] = defaultdict(list)
        for step in self.steps.get(rank, ()):
            by_epoch[step.epoch].extend(step.indices)
        return dict(by_epoch)


@dataclass(frozen=True)
class Checkpoint:
    """The grader's verdict on the checkpoint: its scores, kept only if rank 0's optimizer produced it.

    Attributes:
        test_accuracy: the grader's own evaluation of the checkpoint (perturbed test split), or None.
        val_accuracy: its accuracy on the whole validation split, by the grader.
        fingerprint: its parameter fingerprint, computed by the grader as the probes do.
        error: why it could not be evaluated, or was not (see :func:`bind_checkpoint`).
        step: the rank-0 optimizer step after which rank 0 held its parameters, or None when no recorded
            step did (then ``test_accuracy`` is None).
        foreign: the checkpoint holds parameters, but not ones rank 0's recorded steps produced (a second
            model, weights changed outside ``optimizer.step()``): integrity flags the run for review.
        relation: how a checkpoint that is no single step's weights relates to the recorded training (an EMA,
            an SWA mean: :func:`grader.averages.explain`), in words; None otherwise. Such a checkpoint is graded
            as the student's model.
    """

    test_accuracy: float | None = None
    val_accuracy: float | None = None
    fingerprint: tuple[float, ...] | None = None
    error: str | None = None
    step: int | None = None
    foreign: bool = False
    relation: str | None = None


@dataclass(frozen=True)
class Replay:
    """Rank 0's first gradients against the single-process union-batch gradients, or why they were not."""

    comparisons: tuple[replay.Comparison, ...] = ()
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Evidence(RunRecords):
    """Everything the checks may look at, for one run of one submission: its records and its outcome.

    Attributes (besides :class:`RunRecords`'):
        expected_backend: ``nccl`` on GPUs, ``gloo`` on emulated ones.
        train_size: samples in the training split.
        status: how the run ended (``ok``, ``timeout``, ``hang on rank 3``, ...), see :mod:`grader.runner`.
        test_accuracy, checkpoint_val_accuracy, checkpoint_fingerprint, checkpoint_error, checkpoint_step,
            checkpoint_foreign, checkpoint_relation: the fields of :class:`Checkpoint`.
        comparisons, replay_error: the fields of :class:`Replay`.
    """

    expected_backend: str
    train_size: int = 0
    status: str = "ok"
    test_accuracy: float | None = None
    checkpoint_val_accuracy: float | None = None
    checkpoint_fingerprint: tuple[float, ...] | None = None
    checkpoint_error: str | None = None
    checkpoint_step: int | None = None
    checkpoint_foreign: bool = False
    checkpoint_relation: str | None = None
    comparisons: tuple[replay.Comparison, ...] = ()
    replay_error: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "comparisons", tuple(self.comparisons))
        if self.checkpoint_fingerprint is not None:
            object.__setattr__(self, "checkpoint_fingerprint", tuple(self.checkpoint_fingerprint))

    @classmethod
    def of(cls, records: RunRecords, *, expected_backend: str, status: str, train_size: int,
           checkpoint: Checkpoint = Checkpoint(), replay: Replay = Replay()) -> Evidence:
        """The evidence of a run: its ``records`` and how it ended, the checkpoint's verdict and the replay's."""
        return cls(**{f.name: getattr(records, f.name) for f in fields(RunRecords)},
                   expected_backend=expected_backend, status=status, train_size=train_size,
                   test_accuracy=checkpoint.test_accuracy, checkpoint_val_accuracy=checkpoint.val_accuracy,
                   checkpoint_fingerprint=checkpoint.fingerprint, checkpoint_error=checkpoint.error,
                   checkpoint_step=checkpoint.step, checkpoint_foreign=checkpoint.foreign,
                   checkpoint_relation=checkpoint.relation, comparisons=replay.comparisons, replay_error=replay.error)


def collect(raw: list[dict[str, Any]], world_size: int, rejected_records: int = 0) -> RunRecords:
    """Sort verified records (dicts from :class:`grader.inrank.channel.Reader`) by kind and rank, typed.

    Records of ranks outside ``0..world_size-1`` are ignored. A record's ``signer`` must fit it: exit records
    come from the launcher, every other record from the rank it names (or the launcher, which holds every
    key); others are counted in ``misattributed``, not used. A record that does not fit the format is
    refused, its reason kept in ``malformed``.
    """
    sorted_: dict[str, dict[int, list[Record]]] = {name: {} for name in _BY_KIND}
    exits: dict[int, RankExit] = {}
    last: dict[int, Record] = {}
    misattributed, malformed = 0, []
    for obj in raw:
        rank = obj.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            continue
        signers = (channel.LAUNCHER,) if obj.get("kind") == "rank_exit" else (rank, channel.LAUNCHER)
        if obj.get("signer", channel.LAUNCHER) not in signers:
            misattributed += 1
            continue
        try:
            record = parse(obj)
        except MalformedRecord as error:
            malformed.append(str(error))
            continue
        if isinstance(record, RankExit):
            exits[rank] = record
        else:
            sorted_[_ATTRIBUTE[type(record)]].setdefault(rank, []).append(record)
            last[rank] = record
    return RunRecords(world_size=world_size, **sorted_, exits=exits, last_record=last,
                      rejected_records=rejected_records, misattributed=misattributed, malformed=tuple(malformed))


_ATTRIBUTE = {kind: name for name, kind in _BY_KIND.items()}


def bind_checkpoint(records: RunRecords, checkpoint_digests: list[str] | None, checkpoint: str) -> Checkpoint:
    """Is the checkpoint the model rank 0's optimizer trained? A :class:`Checkpoint` with the ``step`` it was
    bound to, or with the ``error`` saying why not (then the caller must not use the checkpoint's scores).

    The checkpoint's parameter tensors (:func:`grader.inrank.fingerprints.digests`, in any order) must be, bit for
    bit, those rank 0's optimizer held after one of its recorded steps (normally the last), and every step up
    to that one must have started from the parameters the step before it left: the model was changed by
    recorded optimizer steps only. Whatever the script did to ``torch.save``, the probes or its model,
    parameters that this chain of steps did not produce (a second model, trained by hand or by another
    optimizer; weights copied in, averaged, perturbed or edited outside ``optimizer.step()``) are not graded.
    """
    steps = [s for s in records.steps.get(0, ()) if s.digests]
    if not steps:
        return Checkpoint(error="no optimizer step was recorded on rank 0, so there is no trained model to "
                                f"evaluate: train with a torch.optim optimizer, then save {checkpoint}.")
    held = sorted(checkpoint_digests or [])
    match = [i for i, s in enumerate(steps) if sorted(s.digests) == held]
    if match:
        chain = zip(steps[:match[-1]], steps[1:match[-1] + 1], strict=True)  # (step, the step after it)
        broken = next((after for before, after in chain if after.digests_before != before.digests), None)
        if broken is None:
            return Checkpoint(step=steps[match[-1]].step)
        return Checkpoint(foreign=True, error=(
            f"rank 0's parameters changed between its optimizer steps {broken.step - 1} and {broken.step}, "
            f"outside optimizer.step() (or another optimizer took over): the grader evaluates only a model that "
            "your recorded training produced step by step. Change the parameters only through the optimizer "
            "(no copying weights in, no added noise, no re-initialisation)."))
    last = steps[-1]
    ends = [e for e in records.ends.get(0, ()) if e.digests]
    changed = bool(ends) and sorted(ends[-1].digests) != sorted(last.digests)
    return Checkpoint(foreign=True, error=(
        f"{checkpoint} does not hold the parameters rank 0's optimizer produced: they differ from those after "
        f"each of its {len(steps)} recorded steps (the last: step {last.step})"
        + (", and rank 0's parameters changed after that step, outside optimizer.step()" if changed else "")
        + ". The grader evaluates only the model your training produced: save model.state_dict() on rank 0 "
        "right after the last optimizer step, and change the parameters in no other way."))


def judge_checkpoint(records: RunRecords, verdict: dict[str, Any], checkpoint: str) -> Checkpoint:
    """The checkpoint's scores from the grader's evaluation ``verdict`` (:mod:`grader.evaluate`'s JSON), kept
    only if the checkpoint holds parameters rank 0's optimizer produced (:func:`bind_checkpoint`)."""
    if verdict.get("error") is not None:
        return Checkpoint(error=verdict["error"])
    bound = bind_checkpoint(records, verdict.get("digests"), checkpoint)
    fingerprint = verdict.get("fingerprint")
    relation = _averaged(records, fingerprint) if bound.foreign and _only_optimizer_steps(records) else None
    if bound.error is not None and relation is None:
        return bound
    return Checkpoint(test_accuracy=verdict.get("accuracy"), val_accuracy=verdict.get("val_accuracy"),
                      fingerprint=tuple(fingerprint) if fingerprint is not None else None, step=bound.step,
                      relation=relation)


def _only_optimizer_steps(records: RunRecords) -> bool:
    """Rank 0's parameters changed only in its recorded optimizer steps: each step started from the parameters
    the one before it left, and none changed after the last."""
    steps = [s for s in records.steps.get(0, ()) if s.digests]
    chain = all(after.digests_before == before.digests for before, after in zip(steps, steps[1:], strict=False))
    ends = [e for e in records.ends.get(0, ()) if e.digests]
    return bool(steps) and chain and not (ends and sorted(ends[-1].digests) != sorted(steps[-1].digests))


def _averaged(records: RunRecords, fingerprint: list[float] | None) -> str | None:
    """How the checkpoint (its ``fingerprint``) averages rank 0's recorded weights, or None (:mod:`grader.averages`)."""
    steps, initial = records.steps.get(0, ()), records.initials.get(0, ())
    if fingerprint is None or not steps or not initial:
        return None
    dims = fingerprints.FINGERPRINT_DIMS
    trajectory = averages.Trajectory(
        initial=torch.tensor(initial[0].fingerprint[:dims], dtype=torch.float64),
        after=torch.tensor([s.fingerprint[:dims] for s in steps], dtype=torch.float64),
        epochs=tuple(s.epoch for s in steps))
    return averages.explain(trajectory, torch.tensor(fingerprint[:dims], dtype=torch.float64))


def replay_first_steps(records: RunRecords) -> Replay:
    """Rank 0's full records of its first steps, replayed in one process on the union batch (or why not)."""
    full = [s for s in records.steps.get(0, ()) if s.grads is not None]
    if not full:
        return Replay(error="no optimizer step was recorded on rank 0")
    comparisons = []
    try:
        train = None
        for step in full:
            indices = [list(_step(records, rank, step.step).indices) for rank in records.ranks]
            if not any(indices):
                raise ValueError(f"no training samples were fetched through data.load().train for step {step.step}")
            if step.params_before is None or step.shapes is None:
                raise ValueError(f"rank 0's record of step {step.step} lacks its parameters before the step")
            train = train or data.load().train
            shapes = [list(shape) for shape in step.shapes]
            reference = replay.union_batch_gradient(fingerprints.decode(step.params_before), shapes, indices, train)
            comparisons.append(replay.compare(step.step, fingerprints.decode(step.grads), reference))
    except ValueError as error:  # raised above, in the learner's terms
        return Replay(tuple(comparisons), str(error))
    except (RuntimeError, KeyError, IndexError):  # torch's or the grader's own: never quoted to the learner
        return Replay(tuple(comparisons), GRADER_FAULT)
    return Replay(tuple(comparisons))


#: The replay's error when the grader itself failed (not the recorded run): the check is then not assessed.
GRADER_FAULT = "the grader's replay failed on the recorded parameters (a fault of the grader, not of your script)"
_NO_STEP = Step(rank=-1, step=0, epoch=0, indices=(), lr=(), fingerprint=())


def _step(records: RunRecords, rank: int, number: int) -> Step:
    return next((s for s in records.steps.get(rank, ()) if s.step == number), _NO_STEP)


def fingerprints_equal(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> bool:
    """Parameter fingerprints equal up to float rounding (ranks summing in different orders)."""
    if len(a) != len(b):
        return False
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return bool(((x - y).abs() <= 1e-5 * (x.abs() + y.abs()) + 1e-6).all())
