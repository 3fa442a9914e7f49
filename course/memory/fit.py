"""What fits on the catalog's GPUs: the largest per-GPU batch and the largest model, modelled by
:mod:`course.memory.budget` (nothing here runs on a GPU).

GPU memory sizes come from :mod:`course.perf.catalog` plus the larger editions of two of its GPUs. Activations
come from a measured per-sample figure (e.g. ResNet-50's, :func:`course.memory.activations.measure_bytes`). Taught in
``notebooks/07_memory.ipynb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from course.memory.activations import LayerActivation
from course.memory.budget import Setup, checkpointed, largest_batch, largest_model
from course.perf import catalog as hardware

#: larger editions of two catalog GPUs: (device memory in bytes, source)
LARGER_EDITIONS: dict[str, tuple[float, str]] = {
    "V100 SXM2 32GB": (32 * hardware.GB, "Table 1 (16 or 32 GB) of " + hardware.GPUS["V100 SXM2"].source),
    "A100 SXM4 80GB": (80 * hardware.GB, "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                                         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
}

#: device memory in bytes: the catalog's GPUs and their larger editions
GPU_MEMORY: dict[str, float] = {
    **{name: gpu.memory_bytes for name, gpu in hardware.GPUS.items()},
    **{name: memory for name, (memory, _) in LARGER_EDITIONS.items()},
}


@dataclass(frozen=True)
class Fit:
    """The largest setting that fits one GPU, modelled."""

    gpu: str  # catalog name
    memory_gb: float  # its device memory, GB
    label: str  # what was varied, e.g. "fp32, momentum" or "ZeRO-2 on 64 GPUs"
    largest: float  # the largest per-GPU batch, or parameter count, that fits


def segment_activations(layers: list[LayerActivation]) -> tuple[list[float], list[float]]:
    """Saved bytes and input bytes of each top-level child of an ``nn.Sequential`` (what checkpointing cuts at).

    Leaf layers named ``"4.body.0"`` belong to child ``"4"``; its input is its first leaf's input.
    """
    saved: dict[str, float] = {}
    inputs: dict[str, float] = {}
    for layer in layers:
        child = layer.name.split(".")[0]
        saved[child] = saved.get(child, 0.0) + layer.saved_bytes
        inputs.setdefault(child, float(layer.input_bytes))
    return list(saved.values()), list(inputs.values())


def checkpointed_fraction(layers: list[LayerActivation]) -> float:
    """Share of activation memory kept with sqrt(children) checkpoint segments (see :func:`checkpointed`)."""
    saved, inputs = segment_activations(layers)
    return checkpointed(saved, inputs, max(1, round(math.sqrt(len(saved))))) / sum(saved)


def batch_table(num_params: float, activation_bytes_per_sample: float, fraction: float,
                gpus: tuple[str, ...] = ("V100 SXM2", "V100 SXM2 32GB", "A100 SXM4", "A100 SXM4 80GB")
                ) -> list[Fit]:
    """Largest per-GPU batch under DDP: fp32; bf16 mixed precision; bf16 with checkpointing (SGD + momentum)."""
    setups = {"fp32": Setup("momentum"), "bf16 mixed": Setup("momentum", "bf16"),
              "bf16 + checkpointing": Setup("momentum", "bf16", checkpointing=True)}
    return [Fit(gpu, GPU_MEMORY[gpu] / hardware.GB, label,
                largest_batch(GPU_MEMORY[gpu], num_params, activation_bytes_per_sample, setup, fraction))
            for gpu in gpus for label, setup in setups.items()]


def model_table(world_sizes: tuple[int, ...] = (8, 64), gpus: tuple[str, ...] = ("V100 SXM2 32GB", "A100 SXM4 80GB")
                ) -> list[Fit]:
    """Largest parameter count whose model states fit, mixed-precision Adam, per ZeRO stage and world size."""
    return [Fit(gpu, GPU_MEMORY[gpu] / hardware.GB, f"ZeRO-{stage} on {n} GPUs" if stage else f"DDP on {n} GPUs",
                largest_model(GPU_MEMORY[gpu], Setup("adam", "fp16", stage, n)))
            for gpu in gpus for n in world_sizes for stage in range(4)]


def format_fits(fits: list[Fit], unit: str) -> str:
    """A text table, one row per GPU and one column per label; ``unit`` is ``"batch"`` or ``"params"``."""
    labels = list(dict.fromkeys(fit.label for fit in fits))
    gpus = list(dict.fromkeys(fit.gpu for fit in fits))
    cell = {(fit.gpu, fit.label): fit.largest for fit in fits}
    show = (lambda v: f"{v:,.0f}") if unit == "batch" else (lambda v: f"{v / 1e9:,.2f} B")
    lines = [f"{'GPU (modelled)':<18}" + "".join(f"{label:>22}" for label in labels)]
    lines += [f"{gpu:<18}" + "".join(f"{show(cell[gpu, label]):>22}" for label in labels) for gpu in gpus]
    return "\n".join(lines)


def plot_largest_model(gpu: str = "A100 SXM4 80GB", world_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
                       ) -> Figure:
    """Largest model (mixed-precision Adam, model states only) against GPU count, one line per ZeRO stage."""
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for stage in range(4):
        sizes = [largest_model(GPU_MEMORY[gpu], Setup("adam", "fp16", stage, n)) / 1e9 for n in world_sizes]
        axes.plot(world_sizes, sizes, marker="o", label=f"ZeRO-{stage}" if stage else "DDP (ZeRO-0)")
    axes.set(xscale="log", yscale="log", xlabel="GPUs (data-parallel ranks)", ylabel="parameters (billions)",
             title=f"Largest model whose model states fit one {gpu} (modelled)")
    axes.legend()
    figure.tight_layout()
    return figure
