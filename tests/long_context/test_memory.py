"""course.long_context.memory: plain attention keeps bytes that grow with S², blockwise attention with S."""

import pytest

from course.long_context import memory


def test_plain_attention_keeps_quadratic_bytes_and_blockwise_linear():
    plain = [memory.saved_bytes(s, blockwise=False) for s in (64, 128)]
    blockwise = [memory.saved_bytes(s, blockwise=True) for s in (64, 128)]
    assert plain[1] / plain[0] > 3.5  # S² dominates
    assert blockwise[1] == 2 * blockwise[0]  # out and lse only
    assert plain[0] >= 2 * memory.score_bytes(64)  # scores and probabilities, both S x S


@pytest.mark.parametrize("seq_len", [64, 256])
def test_blockwise_keeps_out_and_lse_only(seq_len):
    heads, head_dim = 4, 16
    assert memory.saved_bytes(seq_len, blockwise=True) == 4 * heads * seq_len * (head_dim + 1)
