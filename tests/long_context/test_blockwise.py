"""course.long_context.blockwise: the online softmax and the merge equal one softmax over the whole row, and
blockwise attention equals full attention forward and backward, for any block size (hypothesis)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.long_context import blockwise as bw


def _qkv(seq_len: int, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    """Float64, so that a tolerance of 1e-9 separates a wrong formula from rounding even at large scores."""
    generator = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(2, 3, seq_len, 4, generator=generator, dtype=torch.float64) for _ in range(4)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(0, 10_000), st.floats(0.1, 30.0))
def test_the_online_softmax_equals_softmax_of_the_whole_row(sizes, seed, scale):
    generator = torch.Generator().manual_seed(seed)
    blocks = [scale * torch.randn(size, generator=generator, dtype=torch.float64) for size in sizes]
    maxima, sums, probabilities = bw.online_softmax(blocks)
    assert torch.allclose(probabilities, torch.softmax(torch.cat(blocks), 0))
    assert maxima == sorted(maxima)  # the running maximum never falls


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 12), st.integers(0, 10_000), st.floats(0.5, 20.0))
def test_merging_two_halves_equals_attention_over_both(split_at, seed, scale):
    q, k, v, _ = _qkv(13, seed, scale)
    positions = torch.arange(13)
    whole = bw.block_attention(q, k, v, bw.causal_mask(positions, positions))
    halves = [bw.block_attention(q, k[..., keys, :], v[..., keys, :], bw.causal_mask(positions, positions[keys]))
              for keys in (slice(0, split_at), slice(split_at, 13))]
    out, lse = bw.merge(*halves[0], *halves[1])
    assert torch.allclose(out, whole[0], atol=1e-9) and torch.allclose(lse, whole[1], atol=1e-9)


def test_a_merge_without_rescaling_is_wrong():
    q, k, v, _ = _qkv(8, 0, 5.0)
    positions = torch.arange(8)
    (o_a, l_a), (o_b, l_b) = (bw.block_attention(q, k[..., s, :], v[..., s, :], bw.causal_mask(positions,
                              positions[s])) for s in (slice(0, 4), slice(4, 8)))
    naive = (o_a + o_b) / 2
    assert (naive - bw.attention(q, k, v)[0]).abs().max() > 0.1


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 17), st.integers(0, 10_000))
def test_blockwise_attention_equals_full_attention_forward_and_backward(block, seed):
    q, k, v, dout = _qkv(17, seed)
    grads = []
    for run in (lambda *t: bw.blockwise_attention(*t, block), lambda *t: bw.attention(*t)[0]):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*inputs)
        out.backward(dout)
        grads.append([out.detach(), *(t.grad for t in inputs)])
    for mine, reference in zip(*grads, strict=True):
        assert torch.allclose(mine, reference, atol=1e-9)


def test_full_attention_equals_torch_sdpa():
    q, k, v, _ = _qkv(16, 3)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(bw.attention(q, k, v)[0], expected, atol=1e-9)


def test_a_block_size_below_one_is_refused():
    q, k, v, _ = _qkv(4, 0)
    with pytest.raises(ValueError, match="block must be a positive number"):
        bw.blockwise_attention(q, k, v, 0)
