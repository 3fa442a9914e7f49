"""Notebook 03's questions: a parameter server's traffic, and the micro-batches a pipeline needs."""

from __future__ import annotations

from typing import Any

from course.model_parallel import bubble as pipeline_bubble
from course.naive import parameter_server


def server_bytes(gradient_bytes: int, parameter_bytes: int, workers: int) -> dict[str, Any]:
    """Gradient bytes reaching the server per step, for the model the notebook trained."""
    server_in = parameter_server.server_bytes_per_step(gradient_bytes, parameter_bytes, workers)[0]
    ring_out = parameter_server.allreduce_bytes_per_rank(gradient_bytes, workers)
    return dict(
        prompt=(f"The model's gradient is {gradient_bytes:,} bytes and {workers} workers push theirs to the server "
                "every step. How many bytes of gradients reach the server per step?"),
        answer=server_in, rel_tol=0.01, unit="bytes",
        explanation=(f"W x G = {workers} x {gradient_bytes:,}: every worker sends its whole gradient to one rank, "
                     f"so the server's link carries W times the model, and as many parameters back out. In a ring "
                     f"allreduce each rank sends 2(n-1)/n x G = {ring_out:,.0f} bytes, whatever the number of "
                     "workers."))


def bubble_micro_batches(stages: int = 4) -> dict[str, Any]:
    """The fewest micro-batches that keep GPipe's bubble under 10% with ``stages`` equal stages."""
    enough = next(m for m in range(1, 1000) if pipeline_bubble.bubble_fraction(stages, m) < 0.1)
    return dict(
        prompt=(f"GPipe with {stages} equal stages: at least how many micro-batches m keep the idle bubble under 10% "
                "of the step? Guess now: the exercise further down derives the formula."),
        answer=enough, rel_tol=0.0, unit="micro-batches",
        explanation=(f"The bubble is (p-1)/(m+p-1) = {stages - 1}/(m+{stages - 1}), below 0.1 once m > 9 x "
                     f"{stages - 1} = {9 * (stages - 1)}, so m = {enough}. With m = {stages} it would still be "
                     f"{pipeline_bubble.bubble_fraction(stages, stages):.0%}: a pipeline needs a large batch, cut "
                     "small."))
