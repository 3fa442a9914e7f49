"""The roofline: where a layer's time goes on a GPU, from two numbers per layer and two per GPU.

A kernel that does ``F`` FLOPs while moving ``Q`` bytes to and from memory has **arithmetic intensity**
``I = F / Q`` (FLOPs per byte). On a GPU with peak ``P`` FLOP/s and memory bandwidth ``W`` bytes/s it can reach at
most ``min(P, I·W)`` FLOP/s (Williams, Waterman & Patterson 2009, "Roofline: an insightful visual performance
model for multicore architectures"). The **ridge point** ``P / W`` is the intensity where the two limits meet:
below it a layer is memory-bound (a faster GPU's extra FLOP/s do not help it), above it compute-bound. Every
number here is **modelled** from :mod:`course.perf.catalog` peaks and :mod:`course.perf.workloads` counts.
Taught in ``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from course.perf.catalog import Gpu
from course.perf.workloads import Layer, Workload

if TYPE_CHECKING:  # matplotlib is imported only when plotting
    from matplotlib.figure import Figure

ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "amp": 2, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Point:
    """One layer on one GPU's roofline."""

    name: str
    intensity: float    # FLOPs per byte moved
    attainable: float   # min(peak, intensity x bandwidth), FLOP/s
    bound: str          # "memory" or "compute"


def ridge_point(gpu: Gpu, precision: str) -> float:
    """FLOPs per byte at which ``gpu``'s peak at ``precision`` and its memory bandwidth meet."""
    return gpu.peak_flops(precision) / gpu.memory_bandwidth


def intensity(layer: Layer, batch_size: int, precision: str) -> float:
    """FLOPs per byte of one layer's forward for ``batch_size`` samples: its weights are read once, its
    activations (inputs, outputs, and what its element-wise kernels read and write) once per sample."""
    width = ELEMENT_BYTES[precision]
    moved = (layer.params + layer.activations * batch_size) * width
    return layer.flops * batch_size / moved if moved else float("inf")


def points(workload: Workload, gpu: Gpu, precision: str, batch_size: int) -> list[Point]:
    """Every layer of ``workload`` placed on ``gpu``'s roofline at ``precision``."""
    peak, ridge = gpu.peak_flops(precision), ridge_point(gpu, precision)
    result = []
    for layer in workload.layers:
        i = intensity(layer, batch_size, precision)
        result.append(Point(layer.name, i, min(peak, i * gpu.memory_bandwidth), "compute" if i >= ridge else "memory"))
    return result


def plot(workload: Workload, gpus: list[Gpu], precision: str, batch_size: int) -> Figure:
    """Each GPU's roof (memory slope, then flat peak) and the workload's layers on it."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for gpu, color in zip(gpus, ("tab:blue", "tab:red", "tab:green"), strict=False):
        xs = np.logspace(-1, 4, 200)
        ax.plot(xs, np.minimum(gpu.peak_flops(precision), xs * gpu.memory_bandwidth) / 1e12, color=color,
                label=f"{gpu.name} roof (ridge {ridge_point(gpu, precision):.0f} FLOP/B)")
        layer_points = points(workload, gpu, precision, batch_size)
        ax.plot([p.intensity for p in layer_points], [p.attainable / 1e12 for p in layer_points], "o", color=color,
                ms=4)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOPs per byte)",
           ylabel="attainable TFLOP/s (MODELLED)", title=f"{workload.name}, batch {batch_size}, {precision}: roofline")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
