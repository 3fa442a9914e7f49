"""Context parallelism with causal ring attention: each rank holds some positions' ``q, k, v``; blocks of keys and
values travel around a ring of ranks, and each rank merges its queries' attention over every block it receives.

Forward, ``n`` steps: at step ``s`` rank ``r`` holds the block of rank ``(r - s) mod n``. Before computing on it,
the rank posts the transfer of that block to rank ``r + 1`` and a receive from rank ``r - 1`` (``isend``/``irecv``),
so the next block travels while this one is computed (**overlap**). Each block's ``(out, lse)`` is merged with the
online softmax (``blockwise.merge``). A block entirely in the queries' future is skipped.
Backward runs the same ring. The keys' and values' gradients are accumulated on the rank that computes with
them, so the partial ``dK, dV`` travel with the block: after its last step each goes one more hop, home
(the **return trip**). Liu et al. 2023, Ring Attention with Blockwise Transformers, arXiv:2310.01889; the
layout is ``balance``'s. Taught in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import world
from course.long_context import balance
from course.long_context.blockwise import attention, block_attention, block_backward, causal_mask, merge
from course.runtime.comm_log import CommLog


def _neighbours(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """``(rank, n, next, previous)`` in ``group``; next and previous as global ranks, which isend/irecv take."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return rank, n, to_global((rank + 1) % n), to_global((rank - 1) % n)


def _post(block: torch.Tensor, group: dist.ProcessGroup | None) -> tuple[list, torch.Tensor]:
    """Send ``block`` to the next rank and receive the previous rank's: the requests, and the buffer."""
    _, _, nxt, prv = _neighbours(group)
    incoming = torch.empty_like(block)
    return [dist.isend(block, nxt, group=group), dist.irecv(incoming, prv, group=group)], incoming


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: list[torch.Tensor],
                 group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal ring attention's forward on this rank (no autograd).

    Args:
        q, k, v: ``(B, H, L, D)``: this rank's positions ``ranks[rank]``.
        ranks: every rank's positions (``balance.layout``).

    Returns:
        ``(out, lse)``: ``(B, H, L, D)`` and ``(B, H, L)``, equal to full attention's at this rank's positions.
    """
    rank, n, _, _ = _neighbours(group)
    kv = torch.stack([k, v]).contiguous()  # one message per step: keys and values together
    out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], -torch.inf, dtype=q.dtype, device=q.device)
    for step in range(n):
        if step < n - 1:
            requests, incoming = _post(kv, group)  # the next block travels while this one is computed
        mask = causal_mask(ranks[rank], ranks[(rank - step) % n])
        if mask.any():  # a block wholly in the future is skipped
            out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], mask))
        if step < n - 1:
            _wait(requests)
            kv = incoming
    return out, lse


def ring_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, ranks: list[torch.Tensor], group: dist.ProcessGroup | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal ring attention's backward on this rank: ``(dq, dk, dv)`` of this rank's positions.

    The partial ``dK, dV`` of the block a rank holds go on to the next rank after each step, ``n`` times in all:
    the last hop brings each block's finished gradients home."""
    rank, n, _, _ = _neighbours(group)
    kv = torch.stack([k, v]).contiguous()
    dkv, dq = torch.zeros_like(kv), torch.zeros_like(q)
    for step in range(n):
        if step < n - 1:
            requests, incoming = _post(kv, group)
        mask = causal_mask(ranks[rank], ranks[(rank - step) % n])
        if mask.any():
            dq_b, dk_b, dv_b = block_backward(dout, q, kv[0], kv[1], out, lse, mask)
            dq += dq_b
            dkv = dkv + torch.stack([dk_b, dv_b])
        returning, dkv_in = _post(dkv.contiguous(), group)  # this block's partial dK, dV follow the block
        _wait(returning)
        dkv = dkv_in
        if step < n - 1:
            _wait(requests)
            kv = incoming
    return dq, dkv[0], dkv[1]


class RingAttention(torch.autograd.Function):
    """Causal ring attention with autograd: saves only this rank's ``q, k, v, out, lse``."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: list,  # noqa: ANN001
                group: dist.ProcessGroup | None) -> torch.Tensor:
        out, lse = ring_forward(q, k, v, ranks, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ranks, ctx.group = ranks, group
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor) -> tuple:  # noqa: ANN001
        q, k, v, out, lse = ctx.saved_tensors
        return (*ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.ranks, ctx.group), None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: list[torch.Tensor],
                   group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Causal attention of this rank's ``(B, H, L, D)`` positions over the whole sequence, by ring.

    Raises:
        ValueError: ``q`` whose length is not this rank's number of positions."""
    rank = dist.get_rank(group)
    if q.shape[-2] != len(ranks[rank]):
        raise ValueError(f"rank {rank} holds {len(ranks[rank])} positions but q has {q.shape[-2]}: slice q, k and v "
                         "at ranks[rank] (balance.layout) before calling ring_attention.")
    return RingAttention.apply(q, k, v, ranks, group)


@dataclass(frozen=True)
class Problem:
    """One attention problem, the same on every rank (seeded): ``(B, H, S, D)`` queries, keys and values."""

    batch: int = 1          # sequences
    heads: int = 4          # attention heads
    seq_len: int = 32       # positions in the whole sequence
    head_dim: int = 8       # features per head
    seed: int = 0           # q, k, v and the upstream gradient
    layout: str = "zigzag"  # "zigzag" or "contiguous" (balance.LAYOUTS)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """``(q, k, v, dout)``, each ``(B, H, S, D)``, drawn on the CPU."""
        generator = torch.Generator().manual_seed(self.seed)
        shape = (self.batch, self.heads, self.seq_len, self.head_dim)
        return tuple(torch.randn(shape, generator=generator) for _ in range(4))


def step_on_rank(problem: Problem) -> dict:
    """Run inside a launched rank: ring attention forward and backward beside full attention on one process.

    Returns:
        ``{"out_error", "grad_error": {"q", "k", "v"}, "sends": {"forward", "backward"}: [(peer, nbytes)],
        "work": query-key pairs computed, "positions"}`` on this rank.
    """
    rank, n, device = dist.get_rank(), dist.get_world_size(), world.current().device
    ranks = [positions.to(device) for positions in balance.layout(problem.layout, n, problem.seq_len)]
    mine = ranks[rank]
    q, k, v, dout = (t.to(device) for t in problem.tensors())
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference, _ = attention(*full)
    reference.backward(dout)
    local = [t[..., mine, :].clone().requires_grad_() for t in (q, k, v)]
    with CommLog() as log:
        out = ring_attention(*local, ranks)
        mark = log.mark()
        out.backward(dout[..., mine, :])
    sends = {phase: [(c.peer, c.nbytes) for c in calls if c.name == "isend"]
             for phase, calls in (("forward", log.calls[:mark]), ("backward", log.since(mark)))}
    return {"out_error": float((out.detach() - reference.detach()[..., mine, :]).abs().max()),
            "grad_error": {name: float((mine_t.grad - whole.grad[..., mine, :]).abs().max())
                           for name, mine_t, whole in zip("qkv", local, full, strict=True)},
            "sends": sends, "work": sum(balance.work_per_step([p.cpu() for p in ranks])[rank]),
            "positions": mine.tolist()}
