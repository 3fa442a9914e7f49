"""Notebook 08b's questions: attention's memory, ring attention's sends and load, Ulysses' bytes, and experts."""

from __future__ import annotations

from typing import Any

from course.experts import expert_parallel
from course.experts import router as gating
from course.long_context import balance, memory, variants


def quadratic() -> dict[str, Any]:
    """How much plain attention's saved (B, H, S, S) matrix grows when the sequence doubles."""
    return dict(
        prompt=("Plain attention keeps a (B, H, S, S) matrix for backward. By what factor do those bytes grow when S "
                "doubles?"),
        answer=memory.score_bytes(256) / memory.score_bytes(128), rel_tol=0.0, unit="x",
        explanation="S x S: twice the rows and twice the columns, so four times the bytes.")


def ring_sends(ranks: int = 4) -> dict[str, Any]:
    """Blocks of keys and values each rank sends in ring attention's forward."""
    return dict(
        prompt=f"In ring attention's forward on {ranks} ranks, how many blocks of keys and values does each rank send?",
        answer=float(ranks - 1), rel_tol=0.0, unit="blocks",
        explanation=("Every rank needs the other n - 1 blocks; each step passes one block on, and the last step sends "
                     "nothing since no one needs it any more."))


def imbalance(ranks: int = 4) -> dict[str, Any]:
    """The busiest rank's causal work over the mean, with one contiguous block per rank."""
    return dict(
        prompt=(f"With {ranks} ranks and one contiguous block each, how many times the mean work does the busiest "
                "rank do?"),
        answer=balance.imbalance(balance.layout("contiguous", ranks, 4096 * ranks)), rel_tol=0.03, unit="x",
        explanation=("Rank r attends over r full blocks plus half of its own: r + 1/2 blocks. The last rank does "
                     "n - 1/2 against a mean of n/2: 2 - 1/n times the mean."))


def ulysses_bytes(ranks: int = 4, local_bytes: float = 1.0) -> dict[str, Any]:
    """Ulysses' bytes sent per rank over the ring's, without grouped-query attention."""
    return dict(
        prompt=(f"On {ranks} ranks without grouped-query attention, how many times the ring's bytes does Ulysses send "
                "per rank?"),
        answer=variants.sent_bytes("ulysses", ranks, local_bytes) / variants.sent_bytes("ring", ranks, local_bytes),
        rel_tol=0.02, unit="x",
        explanation=(f"Ulysses sends (n-1)/n of 4 tensors (q, k, v, out): {(ranks - 1) / ranks * 4:g} X. The ring "
                     f"sends n-1 blocks of 2 (k, v): {2 * (ranks - 1)} X. With X one local tensor's bytes."))


def capacity(tokens: int = 16, num_experts: int = 4, k: int = 2, capacity_factor: float = 1.0) -> dict[str, Any]:
    """How many assignments one expert may take under the capacity rule."""
    assignments = tokens * k
    return dict(
        prompt=(f"{tokens} tokens, {num_experts} experts, top-{k}, capacity factor {capacity_factor}: how many "
                "assignments may one expert take?"),
        answer=float(gating.capacity(tokens, num_experts, k, capacity_factor)), rel_tol=0.0, unit="assignments",
        explanation=(f"{tokens} tokens x {k} choices = {assignments} assignments over {num_experts} experts: "
                     f"{assignments / num_experts:g} each at an even load, times the factor."))


def all_to_alls() -> dict[str, Any]:
    """all_to_all_single calls of one expert-parallel layer, forward and backward."""
    return dict(
        prompt=("How many all_to_all_single calls does one expert-parallel layer make in a forward and backward "
                "together?"),
        answer=float(sum(expert_parallel.ALL_TO_ALLS.values())), rel_tol=0.0, unit="calls",
        explanation=("Forward: the counts, the dispatch and the combine. Backward: the combine's and the dispatch's "
                     "gradients; the counts carry no gradient."))
