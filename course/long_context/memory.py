"""Why long sequences run out of memory: what attention keeps for backward, measured against sequence length.

Plain attention keeps its ``(B, H, S, S)`` probabilities for backward: bytes grow with ``S²``. Blockwise attention
with the online softmax (``blockwise.BlockwiseAttention``, FlashAttention's idea) keeps ``q, k, v, out`` and one
log-sum-exp per row: bytes grow with ``S``. That linear part remains, and at 128K tokens it is still too much for
one GPU (``course.perf.context_expert``): tensor parallelism with sequence parallelism (notebook 08) divides it
by ``t``, but ``t`` stays within a node and cannot pass the head count. Context parallelism cuts the sequence for
the whole layer, attention included, so it can go further. Taught in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

import torch

from course.long_context.blockwise import attention, blockwise_attention


def _saved(fn, *inputs: torch.Tensor) -> int:  # noqa: ANN001
    """Bytes autograd saves for backward while ``fn(*inputs)`` runs, each storage once, the inputs left out."""
    storages: dict[int, int] = {}
    own = {t.untyped_storage().data_ptr() for t in inputs}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in own:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(storages.values())


def saved_bytes(seq_len: int, blockwise: bool, batch: int = 1, heads: int = 4, head_dim: int = 16,
                block: int = 64) -> int:
    """Measured bytes attention keeps for backward beyond its inputs, at ``seq_len`` positions.

    Args:
        blockwise: ``blockwise_attention`` (``block`` keys at a time) instead of plain attention.

    Returns:
        Bytes saved by autograd, each storage counted once, ``q, k, v`` themselves left out.
    """
    shape = (batch, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    if blockwise:
        return _saved(lambda *t: blockwise_attention(*t, block), q, k, v)
    return _saved(lambda *t: attention(*t)[0], q, k, v)


def score_bytes(seq_len: int, batch: int = 1, heads: int = 4, element_size: int = 4) -> int:
    """Closed form: one ``(B, H, S, S)`` matrix of scores or probabilities, in bytes."""
    return batch * heads * seq_len * seq_len * element_size
