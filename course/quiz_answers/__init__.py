"""The answers to the notebooks' questions, kept out of the notebooks so that nothing above a question gives it away.

A notebook's question cell calls ``quiz.ask("<name>")`` (notebook 00 onwards): :func:`course.quiz.ask` finds the
question here by its name, builds it and shows it. Each module below holds one notebook's questions, one function
per question named after it (``flops-per-byte`` is ``flops_per_byte``). A function computes the answer with the
course's own functions, and returns the :class:`course.quiz.Question`'s fields as a dict (prompt, answer,
explanation, and choices, unit, rel_tol, source as needed). Its keyword arguments are numbers the notebook
measured before asking, passed by the cell (``quiz.ask("server-bytes", gradient_bytes=...)``).

This package imports no :mod:`course.quiz`: the quiz imports it, on demand.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Which module of this package holds each question, by the question's name.
WHERE: dict[str, str] = {
    "flops-per-byte": "start_here", "hello-sum": "start_here",
    "neuron-updates": "gd_vs_sgd", "cnn-updates": "gd_vs_sgd",
    "noise-scale-trend": "large_batch", "linear-lr": "large_batch",
    "server-bytes": "naive_multi_gpu", "bubble-micro-batches": "naive_multi_gpu",
    "ring-bytes": "allreduce", "fastest-100mb": "allreduce",
    "bucket-count": "distributed_optimizer", "fp16-error": "distributed_optimizer",
    "shard-size": "ddp", "steps-per-epoch": "ddp",
    "cable-steps": "nodes", "cable-bytes": "nodes",
    "assignment-lr": "assignment", "set-epoch": "assignment",
    "adam-bytes": "memory", "zero3-fit": "memory",
    "tp-allreduces": "tensor_pipeline", "in-flight": "tensor_pipeline", "bubble": "tensor_pipeline",
    "autocast-bytes": "real_gpu_practice", "redone-steps": "real_gpu_practice", "hang-blame": "real_gpu_practice",
    "allreduces": "profiling_and_pitfalls", "stuck-loader": "profiling_and_pitfalls",
    "pitfalls": "profiling_and_pitfalls", "compiled-graphs": "profiling_and_pitfalls",
    "exposed-share": "performance_model", "roofline-count": "performance_model", "planner": "performance_model",
    "quadratic": "long_context_and_experts", "ring-sends": "long_context_and_experts",
    "imbalance": "long_context_and_experts", "ulysses-bytes": "long_context_and_experts",
    "capacity": "long_context_and_experts", "all-to-alls": "long_context_and_experts",
    "real-world-size": "what_next", "least-sharding": "what_next",
}


def fields(name: str, **context: Any) -> dict[str, Any]:
    """The fields of question ``name`` (prompt, answer, explanation, ...), computed from ``context``.

    Raises:
        KeyError: no question has that name; the message lists the names known.
        TypeError: ``context`` lacks a number the question needs, or has one it does not take.
    """
    if name not in WHERE:
        raise KeyError(f"no question named {name!r}: expected one of {sorted(WHERE)}; fix: add it to "
                       f"course/quiz_answers/ and to WHERE")
    module = importlib.import_module(f"{__name__}.{WHERE[name]}")
    return getattr(module, name.replace("-", "_"))(**context)
