"""The record format: what the probes write on the record channel and the grader reads, declared once.

Every line on the channel (:mod:`grader.inrank.channel`) carries one record, a JSON object whose ``kind`` names one
of the dataclasses below and whose other keys are that dataclass's fields. The probes
(:mod:`grader.inrank.probes`, inside the student's ranks) build these records and write :meth:`Record.to_dict`;
the launcher writes :class:`RankExit`; the grader turns each verified line back into a typed record with
:func:`parse` (:func:`grader.evidence.collect`), and the checks read only those.

    record = Step(rank=1, step=3, epoch=0, indices=(4, 9), lr=(0.008,), fingerprint=(0.1, 0.2))
    line = record.to_json()                    # '{"kind":"step","v":1,"rank":1,...}'
    assert from_json(line) == record

Format version :data:`VERSION` is written in every record as ``"v"``; a record without it is read as
version 1 (the launcher's exit records do not state it). Envelope fields, added on the way and not by the
record's writer: ``seq`` (its number in its signer's stream, :class:`grader.inrank.channel.Writer`) and ``signer``
(who signed it, :class:`grader.inrank.channel.Reader`). Optional fields left at their default are not written.

A signed record can still be malformed: code in a rank's process can reach that rank's writer and sign
anything (see :mod:`grader.inrank.channel`). :func:`parse` refuses, with :class:`MalformedRecord`, a record that is
not an object, names an unknown kind or version, lacks a field, has one the kind does not declare, or has one
of the wrong type; the grader then counts it against integrity instead of reading it.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

VERSION = 1


class MalformedRecord(ValueError):
    """A record that does not fit the format: the message names the record and what was wrong."""


@dataclass(frozen=True, kw_only=True)
class Record:
    """Fields every record has. ``kind`` is the subclass's; ``rank`` the rank it is about."""

    kind: ClassVar[str] = ""
    rank: int
    seq: int | None = None  # envelope: its number in its signer's stream
    signer: int | str | None = None  # envelope: "launcher" or the rank whose key signed it

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record: ``kind``, ``v``, then every field not left at its default."""
        out: dict[str, Any] = {"kind": self.kind, "v": VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.default is MISSING or value != f.default:
                out[f.name] = _plain(value)
        return out

    def to_json(self) -> str:
        """This record as one line of JSON text (no newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=True)

    # Read access by JSON name (``record["returncode"]``, ``record.get("stopped")``), for code written against
    # the JSON form (grader.runner's status classifier); everything else reads the attributes.
    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default) if name in _names(type(self)) else default

    def __getitem__(self, name: str) -> Any:
        if name not in _names(type(self)):
            raise KeyError(name)
        return getattr(self, name)


@dataclass(frozen=True, kw_only=True)
class Init(Record):
    """The rank joined a process group: as the group itself reports it."""

    kind: ClassVar[str] = "init"
    backend: str
    world_size: int
    group_rank: int | None = None
    pid: int | None = None
    local_rank: int | None = None  # LOCAL_RANK from the environment


@dataclass(frozen=True, kw_only=True)
class Initial(Record):
    """The parameters before the rank's first optimizer step."""

    kind: ClassVar[str] = "initial"
    fingerprint: tuple[float, ...]  # grader.inrank.fingerprints.fingerprint
    device: str  # of the first parameter, e.g. "cpu", "cuda:1"


@dataclass(frozen=True, kw_only=True)
class Step(Record):
    """One optimizer step of the rank, recorded after it."""

    kind: ClassVar[str] = "step"
    step: int  # 1, 2, ...
    epoch: int  # passes over the training split started before it, less one
    indices: tuple[int, ...]  # training samples fetched since the previous step
    lr: tuple[float, ...]  # per param group
    fingerprint: tuple[float, ...]  # of the parameters after the step
    optimizer: str | None = None  # class name
    world_size: int | None = None
    backend: str | None = None
    digests: tuple[str, ...] | None = None  # rank 0: grader.inrank.fingerprints.digests after the step
    digests_before: tuple[str, ...] | None = None  # rank 0: ... before it
    params_before: str | None = None  # rank 0, first steps: grader.inrank.fingerprints.encode of the parameters
    shapes: tuple[tuple[int, ...], ...] | None = None  # ... and their shapes
    grads: str | None = None  # ... and the gradients the step applied
    hyper: dict[str, Any] | None = None  # ... and the first param group's settings
    precision: str | None = None  # "bfloat16" / "float16": the step's forwards ran under autocast or in it


@dataclass(frozen=True, kw_only=True)
class End(Record):
    """How the student's script ended (the harness, once, after the script)."""

    kind: ClassVar[str] = "end"
    how: str  # "returned", "raised", "sys.exit(3)"
    exit_code: int
    steps: int
    error: str | None  # the traceback, when the script raised
    digests: tuple[str, ...] | None  # rank 0: the optimizer's parameters now


@dataclass(frozen=True, kw_only=True)
class Report(Record):
    """A call of course.report.report, with the model's true validation accuracy at that moment."""

    kind: ClassVar[str] = "report"
    epoch: float | None
    val_accuracy: float | None
    true_val_accuracy: float | None
    step: int
    train_loss: float | None = None


@dataclass(frozen=True, kw_only=True)
class Save(Record):
    """A torch.save call."""

    kind: ClassVar[str] = "save"
    path: str
    step: int


@dataclass(frozen=True, kw_only=True)
class Write(Record):
    """A file opened for writing inside the run directory."""

    kind: ClassVar[str] = "write"
    path: str
    step: int


@dataclass(frozen=True, kw_only=True)
class Collective(Record):
    """A collective called from Python, before it runs (its ``seq`` is the channel's record number)."""

    kind: ClassVar[str] = "collective"
    op: str
    step: int
    by_torch: bool = False  # called by torch's own code (FSDP's gathers, ZeroRedundancyOptimizer's broadcasts)


@dataclass(frozen=True, kw_only=True)
class Messages(Record):
    """The point-to-point messages the rank sent and received since its previous ``messages`` record, written
    before its next step, report or end (one record for many messages: a ring sends hundreds per step)."""

    kind: ClassVar[str] = "messages"
    step: int  # optimizer steps taken when the messages were sent
    sent_to: tuple[int, ...]  # ranks it sent to, each once, sorted (ranks of the default group)
    received_from: tuple[int, ...]  # ranks it received from, each once, sorted


@dataclass(frozen=True, kw_only=True)
class Wait(Record):
    """The rank is about to block on point-to-point messages (``recv``, an ``irecv``'s ``wait()``): written before it
    blocks, as a ``collective`` record is, so that a rank hung on a message shows whom it waits for."""

    kind: ClassVar[str] = "wait"
    step: int
    messages: dict[str, Any]  # the rank's course.runtime.waits.Record (Record.to_dict): its messages so far, and
    # those it waits for


@dataclass(frozen=True, kw_only=True)
class Tamper(Record):
    """A function the probes wrapped was replaced by the script."""

    kind: ClassVar[str] = "tamper"
    name: str
    step: int


@dataclass(frozen=True, kw_only=True)
class Shutdown(Record):
    """The process group was destroyed."""

    kind: ClassVar[str] = "shutdown"
    steps: int


@dataclass(frozen=True, kw_only=True)
class Forgery(Record):
    """A call into the probes or the writer from outside the grader's code, written instead of what it asked."""

    kind: ClassVar[str] = "forgery"
    via: str
    caller: str
    forged_kind: str


@dataclass(frozen=True, kw_only=True)
class ProbeError(Record):
    """The grader's own code failed inside the rank's process (its error, not the student's); the probes
    then stopped recording what ``where`` records, and the student's script went on."""

    kind: ClassVar[str] = "probe_error"
    where: str  # the probe that failed, e.g. "optimizer step"
    error: str  # the exception, one line


@dataclass(frozen=True, kw_only=True)
class Call(Record):
    """A call the feedback names: processes started by the script itself (``torch.multiprocessing.spawn``,
    ``start_processes``) or ``torch.compile``."""

    kind: ClassVar[str] = "call"
    function: str  # e.g. "torch.multiprocessing.spawn"
    step: int
    nprocs: int | None = None  # processes it starts


@dataclass(frozen=True, kw_only=True)
class RankExit(Record):
    """The launcher's record of one rank's process: how it exited and what it printed."""

    kind: ClassVar[str] = "rank_exit"
    returncode: int
    stopped: str | None = None  # why the launcher stopped it ("hang", ...), if it did
    order: int | None = None  # its place in the order the ranks exited
    exit_s: float | None = None  # seconds from the start to its exit
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout: str = ""  # the first of it
    stderr: str = ""  # the last of it


KINDS: dict[str, type[Record]] = {cls.kind: cls for cls in (Init, Initial, Step, End, Report, Save, Write,
                                                           Collective, Messages, Wait, Tamper, Shutdown, Forgery,
                                                           ProbeError, Call, RankExit)}


def make(kind: str, **values: Any) -> Record:
    """The record of ``kind`` with ``values`` (no type check: for the probes, which build their own).

    Raises:
        MalformedRecord: ``kind`` is not one of :data:`KINDS`.
    """
    if kind not in KINDS:
        raise MalformedRecord(f"unknown record kind {kind!r}: expected one of {', '.join(KINDS)}.")
    return KINDS[kind](**values)


def parse(obj: Any) -> Record:
    """The typed record of one JSON object, every field checked against its declared type.

    Raises:
        MalformedRecord: naming the record's kind and rank and what was wrong (expected vs got).
    """
    if not isinstance(obj, dict):
        raise MalformedRecord(f"a record must be a JSON object, got {type(obj).__name__}.")
    kind = obj.get("kind")
    where = f"{str(kind)[:30]!r} record" + (f" of rank {repr(obj['rank'])[:30]}" if "rank" in obj else "")
    if not isinstance(kind, str) or kind not in KINDS:
        raise MalformedRecord(f"{where}: unknown kind, expected one of {', '.join(KINDS)}.")
    version = obj.get("v", 1)
    if version != VERSION or isinstance(version, bool):
        raise MalformedRecord(f"{where}: format version {version!r}, this grader reads version {VERSION}.")
    cls = KINDS[kind]
    hints = _hints(cls)
    unknown = sorted(set(obj) - set(hints) - {"kind", "v"})
    if unknown:
        raise MalformedRecord(f"{where}: unexpected field(s) {', '.join(unknown)[:100]}.")
    values = {}
    for f in fields(cls):
        if f.name not in obj:
            if f.default is MISSING:
                raise MalformedRecord(f"{where}: field {f.name!r} is missing.")
            continue
        try:
            values[f.name] = _typed(obj[f.name], hints[f.name])
        except TypeError:
            raise MalformedRecord(f"{where}: field {f.name!r} should be {_describe(hints[f.name])}, got "
                                  f"{_shown(obj[f.name])}.") from None
    return cls(**values)


def from_json(line: str | bytes) -> Record:
    """The typed record in one line of JSON text.

    Raises:
        MalformedRecord: the line is not JSON, or see :func:`parse`.
    """
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedRecord(f"a record line is not JSON ({error}).") from None
    return parse(obj)


def _names(cls: type[Record]) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls)) | {"kind"}


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type[Record]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = {f.name: typing.get_type_hints(cls)[f.name] for f in fields(cls)}
    return _HINTS[cls]


def _typed(value: Any, hint: Any) -> Any:
    """``value`` (decoded JSON) as ``hint`` declares it: lists become tuples, ints become floats where a float
    is declared; bools are not ints. Raises TypeError when it does not fit."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _typed(value, arg)
            except TypeError:
                continue
        raise TypeError(hint)
    if hint is type(None):
        if value is None:
            return None
        raise TypeError(hint)
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(hint)
        return tuple(_typed(v, args[0]) for v in value)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise TypeError(hint)
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise TypeError(hint)


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        return f"a list of {_describe(args[0])}"
    if origin is dict:
        return "an object"
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _shown(value: Any) -> str:
    text = json.dumps(value, allow_nan=True) if _jsonable(value) else repr(value)
    return f"{type(value).__name__} {text[:60]}" + ("..." if len(text) > 60 else "")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return False
    return True


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it (tuples as lists)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value

