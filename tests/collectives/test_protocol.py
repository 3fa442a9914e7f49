"""course.collectives.protocol: what a call may be given, and how it is described to the other ranks (the multi-rank
agreement itself is exercised on 8 ranks by tests/collectives/test_allreduce.py)."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from course.collectives.allreduce import ALGORITHMS
from course.collectives.protocol import (
    _CHECKED_DIMS,
    DTYPES,
    OPS,
    Algorithm,
    call_metadata,
    describe,
    op_name,
    register,
    validate_tensor,
)

ALGORITHM_NAMES = tuple(ALGORITHMS)


def test_a_call_names_its_algorithm_by_its_place_in_the_table():
    assert ALGORITHM_NAMES[:3] == ("naive", "ring", "tree")
    for index, name in enumerate(ALGORITHM_NAMES):
        assert call_metadata(torch.zeros(2), "sum", name)[3] == index


def test_a_name_is_registered_once():
    ring = ALGORITHMS["ring"]
    with pytest.raises(ValueError, match="'ring' is registered already"):
        register(Algorithm("ring", ring.run, ring.cost, ring.schedule))
    assert ALGORITHMS["ring"] is ring


@given(shape=st.lists(st.integers(0, 3), max_size=_CHECKED_DIMS), dtype=st.sampled_from(DTYPES),
       op=st.sampled_from(OPS), algorithm=st.sampled_from(ALGORITHM_NAMES))
def test_call_metadata_describes_the_call_it_was_made_from(shape, dtype, op, algorithm):
    tensor = torch.zeros(shape, dtype=dtype)
    text = describe(call_metadata(tensor, op, algorithm))
    assert text == (f"numel {tensor.numel()}, shape {tuple(shape)}, {dtype}, op {op!r}, {algorithm} allreduce")


def test_dimensions_past_the_checked_ones_fold_into_the_last_slot():
    deep, flat = torch.zeros(2, 1, 1, 1, 1, 3, 5), torch.zeros(2, 1, 1, 1, 1, 15)
    assert call_metadata(deep, "sum", "ring")[5:] == call_metadata(flat, "sum", "ring")[5:]
    assert call_metadata(deep, "sum", "ring")[4] == 7 and call_metadata(flat, "sum", "ring")[4] == 6


def test_both_spellings_of_an_op_name_the_same_op_and_others_are_refused():
    assert [op_name(op) for op in ("sum", "avg", dist.ReduceOp.SUM, dist.ReduceOp.AVG)] == ["sum", "avg", "sum", "avg"]
    for bad in ("max", dist.ReduceOp.MAX, 0):  # 0 == dist.ReduceOp.SUM in torch, but it is no op
        with pytest.raises(ValueError, match="op must be one of"):
            op_name(bad)


def test_a_tensor_that_cannot_be_reduced_in_place_is_refused_in_the_callers_name():
    validate_tensor(torch.zeros(2, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^shm_allreduce supports dtypes"):
        validate_tensor(torch.zeros(3, dtype=torch.int32), "shm_allreduce")
    with pytest.raises(TypeError, match="^allreduce needs a torch.Tensor, got list"):
        validate_tensor([1.0])
