"""Two other ways to split attention over the sequence, beside the ring: an all-gather of keys and values
(Llama 3's context parallelism) and an all-to-all that trades sequence for heads (DeepSpeed-Ulysses).

* **All-gather CP**: every rank gathers every rank's ``k, v``, then computes its own queries against all of them.
  It sends the same bytes as the ring, but not hidden behind compute by default. Llama 3 picked it because with
  grouped-query attention ``k, v`` are small next to ``q``, and any mask (documents packed in one sequence) is easy
  (Dubey et al. 2024, arXiv:2407.21783, section 3.3.2).
* **Ulysses** (Jacobs et al. 2023, arXiv:2309.14509): an all-to-all turns "my positions, every head" into "every
  position, my heads", attention runs whole for those heads, and a second all-to-all turns the output back. It
  needs the number of heads (of keys and values too) divisible by the number of ranks, so it cannot go past the
  head count. Per rank it sends ``4 (n-1)/n`` local tensors; the ring sends ``2 (n-1)`` of them.
:func:`sent_bytes` gives each scheme's bytes per rank; :func:`compare_on_rank` runs all three and checks each
against full attention. Ulysses' backward is autograd through its all-to-alls: the gradient of "piece ``j`` to
rank ``j``" is the same exchange run on the gradients (:class:`AllToAll`), so backward sends the bytes forward did
(``d out`` out, ``dq, dk, dv`` back); :func:`ulysses_gradients_on_rank` checks them against full attention's. The
ring's backward is ``ring_attention``'s. Taught in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course import world
from course.long_context import balance
from course.long_context.blockwise import attention, block_attention, causal_mask
from course.long_context.ring_attention import Problem, ring_forward
from course.runtime.comm_log import CommLog

SCHEMES = ("ring", "all-gather", "ulysses")


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: list[torch.Tensor]
                        ) -> torch.Tensor:
    """All-gather CP: ``(B, H, L, D)`` queries of this rank against every rank's keys and values."""
    n = dist.get_world_size()
    kv = torch.stack([k, v]).contiguous()
    gathered = [torch.empty_like(kv) for _ in range(n)]
    dist.all_gather(gathered, kv)
    every = torch.cat(gathered, dim=-2)  # (2, B, H, S, D), positions in rank order
    mask = causal_mask(ranks[dist.get_rank()], torch.cat(ranks))
    return block_attention(q, every[0], every[1], mask)[0]


def _all_to_all(x: torch.Tensor) -> torch.Tensor:
    """``(n, ...)`` pieces: piece ``j`` goes to rank ``j``; returns piece ``i`` from each rank ``i``."""
    x = x.contiguous()
    out = torch.empty_like(x)  # after .contiguous(): empty_like keeps a view's strides, the wire does not
    dist.all_to_all_single(out, x)
    return out


class AllToAll(torch.autograd.Function):
    """:func:`_all_to_all` with autograd. Rank ``r``'s output piece ``i`` is rank ``i``'s input piece ``r``, so the
    gradient of rank ``i``'s piece ``r`` is rank ``r``'s output gradient piece ``i``: the same exchange again."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return _all_to_all(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return _all_to_all(grad)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: list[torch.Tensor]
                      ) -> torch.Tensor:
    """Ulysses: all-to-all to ``(B, H/n, S, D)``, causal attention on those heads, all-to-all back. Differentiable:
    ``backward`` runs the two all-to-alls again, on the gradients (:class:`AllToAll`).

    Raises:
        ValueError: a head count that the number of ranks does not divide."""
    n = dist.get_world_size()
    batch, heads, length, dim = q.shape
    if heads % n:
        raise ValueError(f"Ulysses gives each of the {n} ranks heads/n heads, but {heads} heads do not divide by "
                         f"{n}: use a number of ranks that divides the head count, or the ring.")

    def to_heads(x: torch.Tensor) -> torch.Tensor:  # (B, H, L, D) -> (B, H/n, S, D), S in rank order
        pieces = AllToAll.apply(x.reshape(batch, n, heads // n, length, dim).transpose(0, 1))
        return pieces.permute(1, 2, 0, 3, 4).reshape(batch, heads // n, n * length, dim)

    every = torch.cat(ranks)
    out = block_attention(to_heads(q), to_heads(k), to_heads(v), causal_mask(every, every))[0]
    back = AllToAll.apply(out.reshape(batch, heads // n, n, length, dim).permute(2, 0, 1, 3, 4))
    return back.transpose(0, 1).reshape(batch, heads, length, dim)


def sent_bytes(scheme: str, world_size: int, local_bytes: int, kv_fraction: float = 1.0) -> float:
    """Bytes one rank sends in one attention forward.

    Args:
        scheme: one of :data:`SCHEMES`.
        local_bytes: one of this rank's ``(B, H, S/n, D)`` tensors (``q``), in bytes.
        kv_fraction: key/value heads over query heads (1 without grouped-query attention; 8/128 for Llama 3 405B).

    Raises:
        ValueError: an unknown scheme.
    """
    n, kv = world_size, 2 * kv_fraction * local_bytes
    sent = {"ring": (n - 1) * kv, "all-gather": (n - 1) * kv,
            "ulysses": (n - 1) / n * (2 * local_bytes + kv)}  # q and out, plus k and v
    if scheme not in sent:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}.")
    return sent[scheme]


def compare_on_rank(problem: Problem) -> dict:
    """Run inside a launched rank: the three schemes' outputs against full attention, and the bytes each sent.

    Returns:
        ``{scheme: {"error": largest |difference|, "sent": bytes this rank sent}}``.
    """
    rank, n, device = dist.get_rank(), dist.get_world_size(), world.current().device
    ranks = [positions.to(device) for positions in balance.layout(problem.layout, n, problem.seq_len)]
    q, k, v, _ = (t.to(device) for t in problem.tensors())
    reference = attention(q, k, v)[0][..., ranks[rank], :]
    local = [t[..., ranks[rank], :].contiguous() for t in (q, k, v)]
    runs = {"ring": lambda: ring_forward(*local, ranks)[0], "all-gather": lambda: allgather_attention(*local, ranks),
            "ulysses": lambda: ulysses_attention(*local, ranks)}
    found = {}
    for scheme, run in runs.items():
        with CommLog() as log:
            out = run()
        kv_bytes = 2 * local[1].numel() * local[1].element_size()
        found[scheme] = {"error": float((out - reference).abs().max()), "sent": _sent(log.calls, n, kv_bytes)}
    return found


def ulysses_gradients_on_rank(problem: Problem) -> dict:
    """Run inside a launched rank: Ulysses forward and backward beside full attention on one process.

    Returns:
        ``{"out_error", "grad_error": {"q", "k", "v"}, "sent": {"forward", "backward"}}``: the largest differences
        at this rank's positions, and the bytes this rank sent in each pass.
    """
    rank, n, device = dist.get_rank(), dist.get_world_size(), world.current().device
    ranks = [positions.to(device) for positions in balance.layout(problem.layout, n, problem.seq_len)]
    mine = ranks[rank]
    q, k, v, dout = (t.to(device) for t in problem.tensors())
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = attention(*full)[0]
    reference.backward(dout)
    local = [t[..., mine, :].clone().requires_grad_() for t in (q, k, v)]
    kv_bytes = 2 * local[1].numel() * local[1].element_size()
    with CommLog() as log:
        out = ulysses_attention(*local, ranks)
        mark = log.mark()
        out.backward(dout[..., mine, :])
    return {"out_error": float((out.detach() - reference.detach()[..., mine, :]).abs().max()),
            "grad_error": {name: float((mine_t.grad - whole.grad[..., mine, :]).abs().max())
                           for name, mine_t, whole in zip("qkv", local, full, strict=True)},
            "sent": {"forward": _sent(log.calls[:mark], n, kv_bytes), "backward": _sent(log.since(mark), n, kv_bytes)}}


def _sent(calls: list, n: int, kv_bytes: int) -> float:
    """Bytes this rank put on the wire: its sends; its own ``k, v`` (``kv_bytes``) to n-1 ranks in an all-gather
    (whose output list the log cannot size); n-1 of an all-to-all's n pieces (the log sizes its output)."""
    total = 0.0
    for call in calls:
        if call.name == "isend":
            total += call.nbytes
        elif call.name == "all_gather":
            total += (n - 1) * kv_bytes
        elif call.name == "all_to_all_single":
            total += (n - 1) * call.nbytes / n
    return total
