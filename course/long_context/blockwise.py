"""Attention one block of keys at a time: the online softmax, the merge of two partial results, and the backward
of one block from the saved log-sum-exp.

Softmax needs the largest score of a row before it can normalise. Over a stream of score blocks the
**online softmax** keeps, per query row, the running maximum ``m`` and the running sum ``l = Σ exp(s - m)``:
when a new block raises the maximum to ``m'``, the old sum and the old weighted values are rescaled by
``exp(m - m')`` before the block's own are added (Milakov & Gimelshein 2018, arXiv:1805.02867; FlashAttention,
Dao et al. 2022, arXiv:2205.14135). The pair ``(m, l)`` folds into one number, the **log-sum-exp**
``lse = m + log l``: a block's result is ``(out, lse)``, and :func:`merge` combines two of them exactly.
Backward needs only ``q, k, v, out, lse``: the probabilities are recomputed as ``exp(s - lse)``, so nothing of
size ``S x S`` is kept (:func:`block_backward`). Positions, not block indices, say who may see whom: a query at
position ``i`` sees the keys at positions ``j <= i``, whichever rank holds them. Taught in
``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

import math

import torch


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(B, H, Lq, D) x (B, H, Lk, D) -> (B, H, Lq, Lk)``: ``q·k / sqrt(D)``."""
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``(Lq, Lk)`` booleans: True where the query at ``q_pos[i]`` may see the key at ``k_pos[j]`` (``j <= i``)."""
    return k_pos[None, :] <= q_pos[:, None]


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` to one block of keys and values under ``mask``.

    Args:
        q: ``(B, H, Lq, D)``; k, v: ``(B, H, Lk, D)``; mask: ``(Lq, Lk)`` booleans, True where allowed.

    Returns:
        ``(out, lse)``: ``(B, H, Lq, D)`` normalised over this block alone and ``(B, H, Lq)`` its log-sum-exp;
        a row that sees no key of the block gets ``out = 0`` and ``lse = -inf`` (it adds nothing in :func:`merge`).
    """
    s = scores(q, k).masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # (B, H, Lq); -inf for a row with no allowed key
    p = torch.exp(s - lse.clamp_min(torch.finfo(s.dtype).min)[..., None])  # exp(-inf) = 0 where masked
    return p @ v, lse


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The online-softmax merge: two partial attentions of the same queries over disjoint keys -> over both.

    Each side's weight is its share of the total ``exp(lse)``, computed from the running maximum
    ``m = max(lse_a, lse_b)`` so that no ``exp`` overflows: ``w_a = exp(lse_a - m)``, ``w_b = exp(lse_b - m)``.

    Returns:
        ``(out, lse)`` with ``lse = m + log(w_a + w_b)`` and ``out = (w_a·out_a + w_b·out_b) / (w_a + w_b)``.
    """
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both -inf: a row that saw nothing yet
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    out = (w_a[..., None] * out_a + w_b[..., None] * out_b) / total.clamp_min(1e-30)[..., None]
    return out, m + torch.log(total)


def online_softmax(row_blocks: list[torch.Tensor]) -> tuple[list[float], list[float], torch.Tensor]:
    """Softmax of one row of scores seen a block at a time: the running maximum and sum after each block.

    Args:
        row_blocks: the row's scores, ``(L_b,)`` each, in the order they arrive.

    Returns:
        ``(maxima, sums, probabilities)``: the running ``m`` and ``l`` after each block, and the softmax of the
        whole row, ``exp(s - m) / l`` with the final ``m`` and ``l``: equal to ``torch.softmax`` of the row.
    """
    m, total, maxima, sums = -math.inf, 0.0, [], []
    for block in row_blocks:
        m_new = max(m, float(block.max()))
        total = total * math.exp(m - m_new) + float(torch.exp(block - m_new).sum())  # rescale the old sum, add
        m = m_new
        maxima.append(m)
        sums.append(total)
    return maxima, sums, torch.exp(torch.cat(row_blocks) - m) / total


def block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients that one block of keys contributes, from the *final* ``out`` and ``lse`` of the queries.

    ``p = exp(s - lse)`` is the block's share of the whole softmax; with ``delta = Σ dout·out`` per row,
    ``ds = p·(dout·vᵀ - delta)``. Summing these over every block gives the gradients of full attention.

    Returns:
        ``(dq, dk, dv)``: ``dq`` for these queries (sum it over blocks), ``dk, dv`` for this block's keys.
    """
    s = scores(q, k).masked_fill(~mask, -math.inf)
    p = torch.exp(s - lse[..., None])  # (B, H, Lq, Lk); 0 where masked
    p = torch.nan_to_num(p, nan=0.0)  # a row with lse = -inf saw no key at all
    dv = p.transpose(-1, -2) @ dout
    delta = (dout * out).sum(-1, keepdim=True)  # (B, H, Lq, 1)
    ds = p * (dout @ v.transpose(-1, -2) - delta) / math.sqrt(q.shape[-1])
    return ds @ k, ds.transpose(-1, -2) @ q, dv


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full attention on one process, the reference: ``(out, lse)`` of ``q`` over every key under ``mask``
    (default: causal over positions ``0 .. S-1``). Differentiable."""
    if mask is None:
        positions = torch.arange(q.shape[-2], device=q.device)
        mask = causal_mask(positions, positions)
    return block_attention(q, k, v, mask)


class BlockwiseAttention(torch.autograd.Function):
    """Causal attention over blocks of ``block`` keys on one process, merged online; keeps only
    ``q, k, v, out, lse`` for backward (no ``S x S`` matrix), as FlashAttention does. ``ring_attention`` runs the
    same loop with the blocks arriving from other ranks."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:  # noqa: ANN001
        positions = torch.arange(q.shape[-2], device=q.device)
        starts = range(0, k.shape[-2], block)
        out, lse = None, None
        for start in starts:
            keys = slice(start, start + block)
            o, lse_b = block_attention(q, k[..., keys, :], v[..., keys, :], causal_mask(positions, positions[keys]))
            out, lse = (o, lse_b) if out is None else merge(out, lse, o, lse_b)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor) -> tuple:  # noqa: ANN001
        q, k, v, out, lse = ctx.saved_tensors
        positions = torch.arange(q.shape[-2], device=q.device)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for start in range(0, k.shape[-2], ctx.block):
            keys = slice(start, start + ctx.block)
            dq_b, dk[..., keys, :], dv[..., keys, :] = block_backward(
                dout, q, k[..., keys, :], v[..., keys, :], out, lse, causal_mask(positions, positions[keys]))
            dq += dq_b
        return dq, dk, dv, None


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """Causal attention of ``(B, H, S, D)`` tensors, ``block`` keys at a time (:class:`BlockwiseAttention`).

    Raises:
        ValueError: a block that is not a positive number of positions."""
    if block < 1:
        raise ValueError(f"block must be a positive number of key positions, got {block}.")
    return BlockwiseAttention.apply(q, k, v, block)
