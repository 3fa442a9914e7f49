"""course.ddp.buckets: greedy ordered bucketing, and flatten/unflatten as exact inverses."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from course.ddp import buckets as bk

pytestmark = pytest.mark.unit4


@given(sizes=st.lists(st.integers(0, 100), max_size=30), bucket_bytes=st.integers(1, 150))
def test_assign_buckets_is_a_greedy_ordered_partition(sizes, bucket_bytes):
    buckets = bk.assign_buckets(sizes, bucket_bytes)
    assert [i for b in buckets for i in b] == list(range(len(sizes)))
    for k, bucket in enumerate(buckets):
        following = buckets[k + 1] if k + 1 < len(buckets) else None
        total = sum(sizes[i] for i in bucket)
        assert bucket and (total <= bucket_bytes or len(bucket) == 1)
        if following:  # greedy: the next tensor did not fit
            assert total + sizes[following[0]] > bucket_bytes


@given(shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=5))
def test_unflatten_inverts_flatten(shapes):
    tensors = [torch.randn(tuple(shape)) for shape in shapes]
    flat = bk.flatten(tensors)
    assert flat.shape == (sum(t.numel() for t in tensors),)
    copies = [torch.empty_like(t) for t in tensors]
    bk.unflatten(flat, copies)
    assert all(torch.equal(a, b) for a, b in zip(tensors, copies, strict=True))
