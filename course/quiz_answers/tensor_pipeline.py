"""Notebook 08's questions: tensor parallelism's all-reduces per block, and 1F1B's memory and bubble."""

from __future__ import annotations

from typing import Any

from course.model_parallel import schedules, tensor_parallel


def tp_allreduces() -> dict[str, Any]:
    """All-reduces one tensor-parallel transformer block makes per step, forward and backward."""
    return dict(
        prompt=("With tensor parallelism, how many all-reduces does ONE transformer block (attention + MLP) make per "
                "training step, forward and backward together?"),
        answer=float(sum(tensor_parallel.ALLREDUCES_PER_LAYER.values())), rel_tol=0.0, unit="all-reduces",
        explanation=("Attention and MLP each have one g (an all-reduce in forward) and one f (an all-reduce in "
                     "backward): 2 + 2. Each moves one activation tensor of B x S x d_model numbers."))


def in_flight(stages: int = 4, micro_batches: int = 8) -> dict[str, Any]:
    """The most micro-batches stage 0 holds at once under 1F1B."""
    held = schedules.in_flight(schedules.one_f_one_b(stages, micro_batches, 0))
    return dict(
        prompt=(f"With p = {stages} stages and m = {micro_batches} micro-batches, at most how many micro-batches' "
                "activations does stage 0 hold at once under 1F1B (under GPipe it is all m)?"),
        answer=float(held), rel_tol=0.0, unit="micro-batches",
        explanation=(f"Stage 0 runs p-1 = {stages - 1} warm-up forwards, then one more forward before its first "
                     f"backward: p = {stages}."))


def bubble(stages: int = 4, micro_batches: int = 8) -> dict[str, Any]:
    """The idle share of a 1F1B step with equal stages."""
    return dict(
        prompt=(f"With equal stages, what fraction of a 1F1B step does each of the {stages} stages sit idle with "
                f"m = {micro_batches}?"),
        answer=(stages - 1) / (micro_batches + stages - 1), rel_tol=0.02,
        explanation=("(p-1)/(m+p-1), like GPipe: 1F1B changes the memory, not the bubble (interleaving changes "
                     "that)."))
