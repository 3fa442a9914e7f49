"""Estimate beside measurement, as text tables and one plot, for ``notebooks/07_memory.ipynb``.

Thin views: the numbers come from :mod:`course.memory.budget` (estimates), :mod:`course.memory.measure` and
:mod:`course.memory.activations` (real tensors), :mod:`course.memory.sharding` (4 real ranks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from torch import nn

from course.memory import activations
from course.memory import budget as mb
from course.memory import measure as memory_measure

#: ZeRO paper, Figure 1: Ψ = 7.5 B, K = 12, N_d = 64; per-device GB for baseline, P_os, P_os+g, P_os+g+p
ZERO_FIGURE_1 = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}


def model_states_rows(make_model: Callable[[], nn.Module], inputs: torch.Tensor, labels: torch.Tensor
                      ) -> list[dict[str, object]]:
    """For each optimizer and precision: one real step on a fresh model, measured bytes beside the estimate."""
    rows = []
    for optimizer in mb.STATE_TENSORS:
        for precision in ("fp32", "bf16"):
            model = make_model()
            params = list(model.parameters())
            estimate = mb.model_states(sum(p.numel() for p in params), mb.Setup(optimizer, precision), len(params))
            measured = (memory_measure.fp32_step(model, optimizer, inputs, labels) if precision == "fp32" else
                        memory_measure.mixed_precision_step(model, optimizer, inputs, labels, precision))
            rows.append({"optimizer": optimizer, "precision": precision, "num_params": sum(p.numel() for p in params),
                         "estimate": estimate, "measured": measured})
    return rows


def format_model_states(rows: list[dict[str, object]]) -> str:
    """One line per row: estimated / measured bytes of parameters, gradients, optimizer state."""
    lines = [f"{'optimizer':<10}{'precision':<10}{'params est/meas':>20}{'grads est/meas':>20}"
             f"{'opt. state est/meas':>24}{'bytes/param':>13}"]
    for row in rows:
        e, m = row["estimate"], row["measured"]
        per_param = m.model_states / row["num_params"]
        lines.append(f"{row['optimizer']:<10}{row['precision']:<10}{e.parameters:>10,.0f}/{m.parameters:<9,}"
                     f"{e.gradients:>10,.0f}/{m.gradients:<9,}{e.optimizer_state:>12,.0f}/{m.optimizer_state:<11,}"
                     f"{per_param:>13.2f}")
    return "\n".join(lines)


def zero_paper_rows(num_params: float = 7.5e9, world_size: int = 64) -> list[tuple[int, float, float]]:
    """(stage, estimated GB, published GB) for the ZeRO paper's Figure 1 example."""
    return [(stage, mb.model_states(num_params, mb.Setup("adam", "fp16", stage, world_size)).model_states / 1e9,
             published) for stage, published in ZERO_FIGURE_1.items()]


def activation_rows(model: nn.Module, batch_sizes: tuple[int, ...], num_classes: int = 10,
                    sample_shape: tuple[int, ...] = (1, 8, 8)) -> list[tuple[int, int, int]]:
    """(per-rank batch, estimated bytes, measured bytes saved for backward) for each batch size."""
    rows = []
    for batch in batch_sizes:
        inputs, labels = torch.randn(batch, *sample_shape), torch.randint(0, num_classes, (batch,))
        rows.append((batch, activations.estimate_bytes(model, inputs, num_classes),
                     activations.measure_bytes(model, inputs, labels)))
    return rows


def checkpoint_rows(model: nn.Sequential, inputs: torch.Tensor, labels: torch.Tensor, num_classes: int = 10
                    ) -> list[tuple[int, int, int]]:
    """(segments, estimated, measured bytes held between forward and backward) under ``checkpoint_sequential``."""
    return [(segments, activations.checkpointed_estimate(model, inputs, segments, num_classes),
             activations.measure_checkpointed(model, inputs, labels, segments))
            for segments in range(1, len(model) + 1)]


#: A column of a per-rank table: title, width, the method's key in a rank's results, the value's key, format.
Column = tuple[str, int, str, str, str]


def _rank_table(results: list[dict[str, dict[str, float]]], columns: list[Column]) -> str:
    """One line per rank: ``result[method][key]`` for each column, under the columns' titles."""
    lines = [f"{'rank':<5}" + "".join(f"{title:>{width}}" for title, width, *_ in columns)]
    for rank, result in enumerate(results):
        lines.append(f"{rank:<5}" + "".join(f"{result[method][key]:>{width}{form}}"
                                            for _, width, method, key, form in columns))
    return "\n".join(lines)


def format_sharding(results: list[dict[str, dict[str, float]]]) -> str:
    """Per rank: ZeRO-1 optimizer state and FSDP parameter shard, measured beside the estimate, and max |Δ| vs DDP."""
    return _rank_table(results, [
        ("ZeRO-1 opt. state: measured", 28, "zero1", "optimizer_state", ",.0f"),
        ("owned est.", 12, "zero1", "owned_optimizer_state", ",.0f"),
        ("Ψ/N est.", 10, "zero1", "ideal_optimizer_state", ",.0f"), ("|Δ| vs DDP", 12, "zero1", "max_diff", ".1e"),
        ("FSDP params: measured", 23, "fsdp", "parameters", ",.0f"),
        ("chunk est.", 12, "fsdp", "chunk_parameters", ",.0f"),
        ("Ψ/N est.", 10, "fsdp", "ideal_parameters", ",.0f"), ("|Δ| vs DDP", 12, "fsdp", "max_diff", ".1e")])


def format_zero2(results: list[dict[str, dict[str, float]]]) -> str:
    """Per rank: FSDP2 without resharding after forward (ZeRO-2's sharding and communication during a step)
    measured beside the stage-2 estimate: parameters held between forward and backward (whole), gradients and
    optimizer state (sharded); ZeRO-3's parameters at the same moment for contrast, and max |Δ| vs DDP. Between
    steps it holds only the parameter shard, less than ZeRO-2."""
    return _rank_table(results, [
        ("no-reshard params after fwd", 28, "zero2", "parameters_after_forward", ",.0f"),
        ("est.", 8, "zero2", "ideal_parameters", ",.0f"), ("grads", 8, "zero2", "gradients", ",.0f"),
        ("Ψ/N est.", 10, "zero2", "ideal_gradients", ",.0f"), ("opt. state", 12, "zero2", "optimizer_state", ",.0f"),
        ("Ψ/N est.", 10, "zero2", "ideal_optimizer_state", ",.0f"), ("|Δ| vs DDP", 12, "zero2", "max_diff", ".1e"),
        ("ZeRO-3 params after fwd", 25, "fsdp", "parameters_after_forward", ",.0f")])


def plot_budgets(budgets: dict[str, mb.Budget], memory_bytes: float, title: str) -> Figure:
    """Stacked bars of one rank's budget per setting, against the GPU's memory (a dashed line)."""
    figure, axes = plt.subplots(figsize=(6.5, 3.5))
    parts = ("parameters", "gradients", "optimizer_state", "activations")
    bottoms = [0.0] * len(budgets)
    for part in parts:
        heights = [getattr(b, part) / 1e9 for b in budgets.values()]
        axes.bar(list(budgets), heights, bottom=bottoms, label=part.replace("_", " "))
        bottoms = [a + b for a, b in zip(bottoms, heights, strict=True)]
    axes.axhline(memory_bytes / 1e9, color="k", linestyle="--", label=f"GPU memory ({memory_bytes / 1e9:.0f} GB)")
    axes.set(ylabel="GB per GPU (modelled)", title=title)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure
