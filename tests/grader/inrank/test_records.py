"""grader.inrank.records: every record kind survives JSON and back unchanged; anything else is refused, saying why."""

import json
import math
import types
import typing
from dataclasses import MISSING, fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grader.inrank import records
from grader.inrank.records import KINDS, VERSION, MalformedRecord, from_json, parse

pytestmark = pytest.mark.unit6
TEXT = st.text(max_size=20)
FLOAT = st.floats(allow_nan=False, width=64)
INT = st.integers(-(2**40), 2**40)
JSON_VALUE = st.recursive(st.none() | st.booleans() | INT | FLOAT | TEXT,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                          max_leaves=8)


def values_of(hint) -> st.SearchStrategy:
    """Values fitting a field's declared type (JSON's: lists as tuples, floats finite)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(values_of(a) for a in args))
    if origin is tuple:
        return st.lists(values_of(args[0]), max_size=4).map(tuple)
    if origin is dict:
        return st.dictionaries(TEXT, JSON_VALUE, max_size=3)
    return {type(None): st.none(), bool: st.booleans(), int: INT, float: FLOAT, str: TEXT}[hint]


@st.composite
def any_record(draw) -> records.Record:
    cls = draw(st.sampled_from(list(KINDS.values())))
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        if f.default is MISSING or draw(st.booleans()):
            values[f.name] = draw(values_of(hints[f.name]))
    return cls(**values)


@settings(max_examples=150, deadline=None)
@given(any_record())
def test_every_record_comes_back_from_json_unchanged(record):
    line = record.to_json()
    assert from_json(line) == record
    obj = json.loads(line)
    assert obj["kind"] == record.kind and obj["v"] == VERSION


@settings(max_examples=100, deadline=None)
@given(any_record(), st.data())
def test_a_field_of_another_type_is_refused_naming_the_field(record, data):
    obj = record.to_dict()
    name = data.draw(st.sampled_from([f.name for f in fields(record)]))
    hint = typing.get_type_hints(type(record))[name]
    wrong = data.draw(JSON_VALUE.filter(lambda v: not _fits(v, hint)))
    with pytest.raises(MalformedRecord, match=f"field '{name}' should be"):
        parse({**obj, name: wrong})


@st.composite
def any_object(draw) -> dict:
    """A JSON object shaped like a record of some kind: some of its fields, any values, perhaps others."""
    cls = draw(st.sampled_from(list(KINDS.values())))
    names = [f.name for f in fields(cls)] + ["v", "kind", "extra"]
    obj = draw(st.dictionaries(st.sampled_from(names), JSON_VALUE, max_size=len(names)))
    return {"kind": cls.kind, **obj} if draw(st.booleans()) else obj


@settings(max_examples=300, deadline=None)
@given(any_object())
def test_any_json_object_is_a_record_of_its_kind_or_refused_never_an_error(obj):
    try:
        record = parse(obj)
    except MalformedRecord as refused:
        assert str(refused)
    else:
        assert record.kind == obj["kind"] and parse(record.to_dict()) == record


def _fits(value, hint) -> bool:
    try:
        records._typed(value, hint)
    except TypeError:
        return False
    return True


def test_a_nan_learning_rate_is_kept():
    step = records.Step(rank=0, step=1, epoch=0, indices=(1,), lr=(math.nan,), fingerprint=(0.0,))
    assert math.isnan(from_json(step.to_json()).lr[0])


def test_optional_fields_left_at_their_default_are_not_written_but_required_ones_always_are():
    end = records.End(rank=1, how="returned", exit_code=0, steps=3, error=None, digests=None)
    assert end.to_dict() == {"kind": "end", "v": VERSION, "rank": 1, "how": "returned", "exit_code": 0, "steps": 3,
                             "error": None, "digests": None}
    assert "digests" not in records.Step(rank=1, step=1, epoch=0, indices=(), lr=(), fingerprint=()).to_dict()


def test_records_without_a_version_are_read_as_version_1():
    """The launcher's exit records do not state their version."""
    assert parse({"kind": "rank_exit", "rank": 2, "returncode": -9}) == records.RankExit(rank=2, returncode=-9)


@pytest.mark.parametrize("line, says", [
    ("{not json", "a record line is not JSON"),
    ("[1, 2]", "a record must be a JSON object, got list"),
    ('{"kind": "step"}', "'step' record: field 'rank' is missing"),
    ('{"kind": "launch", "rank": 0}', "'launch' record of rank 0: unknown kind, expected one of init, initial, step"),
    ('{"kind": ["step"], "rank": 0}', "\"['step']\" record of rank 0: unknown kind"),
    ('{"kind": "shutdown", "rank": 0, "steps": 1, "v": "1"}', "format version '1', this grader reads version 1"),
    ('{"kind": "shutdown", "rank": true, "steps": 1}', "field 'rank' should be int, got bool true"),
    ('{"kind": "shutdown", "rank": 0, "steps": 1.5}', "field 'steps' should be int, got float 1.5"),
    ('{"kind": "save", "rank": 0, "step": 1, "path": ["/run/x"]}', "field 'path' should be str, got list"),
    ('{"kind": "init", "rank": 0, "backend": "gloo", "world_size": 4, "__class__": 1}',
     "unexpected field(s) __class__"),
])
def test_malformed_lines_are_refused_with_what_was_wrong(line, says):
    with pytest.raises(MalformedRecord) as refused:
        from_json(line)
    assert says in str(refused.value)


def test_the_probes_cannot_build_an_unknown_kind():
    with pytest.raises(MalformedRecord, match="unknown record kind 'stepp'"):
        records.make("stepp", rank=0)


def test_records_read_like_their_json():
    """runner._status reads exits and last records by their JSON names."""
    exit_ = records.RankExit(rank=1, returncode=1, stopped="hang")
    assert exit_["returncode"] == 1 and exit_.get("stopped") == "hang" and exit_.get("kind") == "rank_exit"
    assert exit_.get("op", "none") == "none"
    with pytest.raises(KeyError):
        exit_["op"]
