"""Which positions each rank holds under context parallelism, and how much causal work that gives it.

Cut a sequence of ``S`` positions into ``n`` contiguous blocks, one per rank, and causal attention is unfair:
rank ``r``'s queries see ``r + 1/2`` blocks of keys, so the last rank does about ``2 - 1/n`` times the average
work while rank 0 idles. The fix used by Megatron-LM's context parallelism and by Llama 3 (Dubey et al. 2024,
arXiv:2407.21783, section 3.3.2) cuts the sequence into ``2n`` chunks and gives rank ``r`` chunks ``r`` and
``2n - 1 - r`` (a **zigzag**): an early chunk and a late one, whose work adds up to the same on every rank.
Taught in ``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

import torch


def _check(world_size: int, seq_len: int, chunks: int) -> None:
    if world_size < 1 or seq_len % chunks:
        raise ValueError(f"a sequence of {seq_len} positions does not cut into {chunks} equal chunks for "
                         f"{world_size} ranks: use a seq_len that {chunks} divides.")


def contiguous_positions(rank: int, world_size: int, seq_len: int) -> torch.Tensor:
    """``(seq_len / world_size,)`` positions of rank's one contiguous block.

    Raises:
        ValueError: a seq_len that world_size does not divide."""
    _check(world_size, seq_len, world_size)
    block = seq_len // world_size
    return torch.arange(rank * block, (rank + 1) * block)


def zigzag_positions(rank: int, world_size: int, seq_len: int) -> torch.Tensor:
    """``(seq_len / world_size,)`` positions of rank's two chunks: chunk ``rank`` and chunk ``2n - 1 - rank``.

    Raises:
        ValueError: a seq_len that 2 x world_size does not divide."""
    _check(world_size, seq_len, 2 * world_size)
    chunk = seq_len // (2 * world_size)
    late = 2 * world_size - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(late * chunk, (late + 1) * chunk)])


LAYOUTS = {"contiguous": contiguous_positions, "zigzag": zigzag_positions}


def layout(name: str, world_size: int, seq_len: int) -> list[torch.Tensor]:
    """Every rank's positions under the layout ``name`` (``"contiguous"`` or ``"zigzag"``).

    Raises:
        ValueError: an unknown layout name."""
    if name not in LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {name!r}.")
    return [LAYOUTS[name](rank, world_size, seq_len) for rank in range(world_size)]


def causal_work(positions: torch.Tensor) -> int:
    """Query-key pairs causal attention computes for these query positions: ``Σ (p + 1)``."""
    return int((positions + 1).sum())


def imbalance(ranks: list[torch.Tensor]) -> float:
    """The busiest rank's causal work over the mean: 1.0 is perfect balance; every rank waits for the busiest."""
    work = [causal_work(p) for p in ranks]
    return max(work) / (sum(work) / len(work))


def work_per_step(ranks: list[torch.Tensor]) -> list[list[int]]:
    """``[rank][step]``: query-key pairs rank computes at each ring step, on the block it holds at that step
    (block of rank ``(rank - step) mod n``, as in ``ring_attention``). A zero is a block it can skip."""
    n = len(ranks)
    return [[int((ranks[(rank - step) % n][None, :] <= ranks[rank][:, None]).sum()) for step in range(n)]
            for rank in range(n)]
