"""The performance model's calibration set: microbenchmark figures, and every efficiency and latency fitted from them.

A constant of :mod:`course.perf.model` is either *fitted* here, once, from a published microbenchmark (a
transport's measured bus bandwidth, one GEMM's achieved FLOP/s on one GPU generation), or *assumed* (an order of
magnitude with no figure behind it, said so in its row). Validation (:mod:`course.perf.published`) then uses these
defaults only: no row may change them. Each fit is a ratio, ``measured / peak``:

    transport efficiency = nccl-tests bus bandwidth / the link's peak per direction (per adapter)
    matmul efficiency    = a large GEMM's achieved FLOP/s / the GPU's peak at that precision
    GEMM depth k_half    = k x (1/c - 1), where c = a GEMM of depth k's FLOP/s / the best shape's: the shape term
                           of :func:`gemm_efficiency`, best x k / (k + k_half)
    α (latency per step) = an 8-byte or small allreduce's time / its number of steps

Two kinds of constant are end-to-end. The sustained fraction of these rates that a transformer's training step
reaches (:data:`TRAINING_EFFICIENCY`, one per GPU generation) is fitted on the *fitting set* of
:mod:`course.perf.figures` only (:mod:`course.perf.protocol`), never on a test figure. And one figure's row is
labelled *calibration* in the validation table:
no sourced cuDNN figure was at hand for FP32 convolutions, so their efficiency is fitted to 90 epochs of ResNet-50
on one M40 (14 days, You et al. 2017), and every other CNN row (other GPUs, networks and counts) predicts.
The one GPU measurement the course has (``benchmarks/results/gpu-check-nvidia-h100-80gb-hbm3-2026-11-28.md``: a
ResNet-50 step on one H100 took 2.22x the modelled time) fits nothing here: one CNN step cannot tell the
convolutions' rate from launches and memory traffic. ``benchmarks/gpu_kernels.py`` measures them apart on the next
lent GPU. Taught in ``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course.perf.catalog import BF16_GENERATIONS

NCCL_TESTS_149 = "https://github.com/NVIDIA/nccl-tests/issues/149 (S. Jeaugey, NVIDIA: ~230 GB/s on A100 NVLink 3)"
NCCL_TESTS_29 = "https://github.com/NVIDIA/nccl-tests/issues/29 (S. Jeaugey: 12.2 GB/s on a 100 Gb/s EDR adapter)"
NCCL_495 = "https://github.com/NVIDIA/nccl/issues/495 (2 A100 nodes, 8 x 100 Gb/s RoCE: 600 Gb/s busbw)"
NCCL_209 = "https://github.com/NVIDIA/nccl/issues/209 (NCCL over TCP: no more than ~60% of wire speed)"
NCCL_1530 = "https://github.com/NVIDIA/nccl/issues/1530 (8 PCIe GPUs: an 8-byte allreduce in 42 µs, 14 steps)"
NCCL_TESTS_44 = "https://github.com/NVIDIA/nccl-tests/issues/44 (2 GPUs on an NVLink bridge: 32 KiB in 13.4 µs)"
MAMF = ("S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS' table: "
        "https://github.com/stas00/ml-engineering/tree/master/compute/accelerator")
SGEMM = "https://github.com/Yinghan-Li/YHs_Sample/issues/4 (cuBLAS SGEMM 18.88 of 19.49 TFLOP/s, A100 PCIe)"
V100_HGEMM = "https://github.com/lablup/mlxcel/issues/1654 (cuBLAS FP16 GEMM on V100: 95-100 of 125 TFLOP/s)"
FLASH2 = ("Dao 2023, FlashAttention-2, https://arxiv.org/abs/2307.08691, abstract (50-73% of the theoretical "
          "maximum on A100)")
FLASH3 = ("Shah et al. 2024, FlashAttention-3, https://arxiv.org/abs/2407.08608, abstract (FlashAttention-2: "
          "only 35% utilization on H100)")
SHALLOW_GEMM = ("https://github.com/pytorch/pytorch/issues/83272 (A100, CUDA 11.7: FP16 bmm of 512 x 1024x128 by "
                "128x1024 at 132.46 TFLOP/s)")


@dataclass(frozen=True)
class Figure:
    """One calibration figure: what was measured, the value, the peak it is divided by, and where it is published.

    ``fits`` names the constant it sets (e.g. ``"transport.infiniband"``); ``peak`` 0 means the value *is* the
    constant (a latency); ``assumed`` marks a constant with no measurement behind it.
    """

    fits: str
    what: str
    value: float
    peak: float
    source: str
    assumed: bool = False

    @property
    def constant(self) -> float:
        return self.value / self.peak if self.peak else self.value


FIGURES: tuple[Figure, ...] = (
    # transports: sustained fraction of a link's (adapter's) peak per direction
    Figure("efficiency.nvlink", "allreduce busbw, 8 A100 on NVSwitch (GB/s)", 230, 300, NCCL_TESTS_149),
    Figure("efficiency.infiniband", "allreduce busbw, one EDR adapter (GB/s)", 12.2, 12.5, NCCL_TESTS_29),
    Figure("efficiency.roce", "allreduce busbw, 8 x 100 Gb/s RoCE per node (Gb/s)", 600, 800, NCCL_495),
    Figure("efficiency.tcp", "allreduce busbw over TCP sockets, fraction of wire speed", 0.6, 1.0, NCCL_209),
    Figure("efficiency.pcie", "allreduce busbw on PCIe 3.0 x16, fraction of peak", 0.75, 1.0,
           "no sourced nccl-tests figure for PCIe 3.0 was found", assumed=True),
    # latency of one allreduce step (seconds)
    Figure("alpha.nvlink", "2-GPU allreduce of 32 KiB: (13.4 µs - 32 KiB / 21.4 GB/s) / 2 steps", 5.9e-6, 0,
           NCCL_TESTS_44),
    Figure("alpha.pcie", "8-GPU allreduce of 8 bytes: 42 µs / 14 steps", 3.0e-6, 0, NCCL_1530),
    Figure("alpha.infiniband", "one network step over RDMA", 5e-6, 0, "an order of magnitude", assumed=True),
    Figure("alpha.roce", "one network step over RDMA on Ethernet", 8e-6, 0, "an order of magnitude",
           assumed=True),
    Figure("alpha.tcp", "one network step through the kernel's TCP stack", 50e-6, 0, "an order of magnitude",
           assumed=True),
    # compute: a large GEMM's achieved fraction of the peak at its precision, per GPU generation
    Figure("matmul.fp32", "cuBLAS SGEMM 5120x4096x4096, A100 PCIe (TFLOP/s)", 18.88, 19.49, SGEMM),
    Figure("matmul.half.Volta", "cuBLAS FP16 GEMM, V100 (TFLOP/s)", 97.5, 125, V100_HGEMM),
    Figure("matmul.half.Ampere", "BF16 matmul, best shape, A100 SXM (TFLOP/s)", 271.2, 312, MAMF),
    Figure("matmul.half.Hopper", "BF16 matmul, best shape, H100 SXM (TFLOP/s)", 794.5, 989, MAMF),
    # a part with its own measurement: the PCIe A100 (250-300 W) keeps less of the same peak than the SXM one
    Figure("matmul.half.A100 PCIe", "BF16 matmul, best shape, A100 PCIe (TFLOP/s)", 252.9, 312, MAMF),
    # shape: a GEMM whose reduction depth k is short reaches less of the best-shape rate (module docstring)
    Figure("matmul.depth128", "FP16 bmm with k = 128, A100, over the best-shape BF16 rate (TFLOP/s)", 132.46, 271.2,
           SHALLOW_GEMM),
    # a fused (flash) attention kernel's forward and backward, fraction of the 16-bit peak
    Figure("attention.Ampere", "FlashAttention-2 on A100: 50-73% of peak; the range's middle", 0.615, 1.0,
           FLASH2),
    Figure("attention.Hopper", "FlashAttention-2 on H100: about 35% of peak", 0.35, 1.0, FLASH3),
    Figure("memory", "element-wise kernels, fraction of peak memory bandwidth", 0.8, 1.0,
           "stream-like kernels reach ~80% of HBM peak", assumed=True),
    Figure("launch", "launch and scheduling of one kernel (s)", 5e-6, 0, "an order of magnitude",
           assumed=True),
    Figure("framework", "per-step framework overhead: Python, optimizer launch, bookkeeping (s)", 2e-3, 0,
           "an order of magnitude", assumed=True),
)

#: FP32 convolution efficiency, fitted in :func:`course.perf.published.conv_efficiency` to ResNet-50 on one M40
#: (the one end-to-end calibration, labelled so in the table), then frozen here so the model does not depend on
#: the table. ``tests/perf/test_published.py`` checks the two agree.
CONV_EFFICIENCY = 0.407


def constant(name: str) -> float:
    """The fitted (or assumed) value of ``name``, e.g. ``constant("efficiency.tcp")``.

    Raises:
        KeyError: no figure fits that name; the message lists those that exist.
    """
    for figure in FIGURES:
        if figure.fits == name:
            return figure.constant
    raise KeyError(f"no calibration figure fits {name!r}; known: {sorted(f.fits for f in FIGURES)}.")


def matmul_efficiency(precision: str, generation: str, part: str = "") -> float:
    """A large GEMM's fraction of peak: FP32/TF32 from the SGEMM figure; 16-bit tensor cores by GPU generation
    (Volta, Ampere, Hopper; any other generation, e.g. Pascal's FP16 units, falls back to Volta's figure).
    BF16 on a GPU without BF16 units (before Ampere) takes the FP32 figure, as its peak takes the FP32 rate.

    ``part`` is the catalog name (``"A100 PCIe 80GB"``): a part measured on its own (``matmul.half.A100 PCIe``)
    takes its own figure, since a PCIe card's lower power limit holds its clocks lower under a long GEMM; a part
    with no measurement of its own (H100 PCIe, H100 NVL) takes its generation's, said so by :func:`measured_part`.
    """
    if precision in ("fp32", "tf32") or (precision == "bf16" and generation not in BF16_GENERATIONS):
        return constant("matmul.fp32")  # BF16 before Ampere runs on the FP32 units (catalog.Gpu.has_bf16)
    own = measured_part(part)
    if own:
        return constant(f"matmul.half.{own}")
    names = {f.fits for f in FIGURES}
    return constant(f"matmul.half.{generation}" if f"matmul.half.{generation}" in names else "matmul.half.Volta")


def measured_part(part: str) -> str:
    """The part of :data:`FIGURES` whose own best-shape GEMM was measured that ``part`` (a catalog name) is, or
    ``""`` when none was: ``measured_part("A100 PCIe 80GB") == "A100 PCIe"``."""
    for figure in FIGURES:
        name = figure.fits.removeprefix("matmul.half.")
        if figure.fits.startswith("matmul.half.") and " " in name and part.startswith(name):
            return name
    return ""


def attention_efficiency(generation: str) -> float:
    """A fused (flash) attention kernel's fraction of the 16-bit peak on ``generation`` (Ampere's figure for any
    generation without its own)."""
    names = {f.fits for f in FIGURES}
    return constant(f"attention.{generation}" if f"attention.{generation}" in names else "attention.Ampere")


#: The fraction of the microbenchmarks' rates that a transformer's kernels sustain inside a training step, per GPU
#: generation: **fitted** on the fitting set of :mod:`course.perf.figures` only, by
#: :func:`course.perf.protocol.fit_training_efficiency` (``tests/perf/test_validation_protocol.py`` checks the two
#: agree). A generation with no figure in the fitting set keeps 1.0 (unfitted, said so).
TRAINING_EFFICIENCY: dict[str, float] = {"Ampere": 0.84, "Hopper": 0.80}


def training_efficiency(generation: str) -> float:
    """:data:`TRAINING_EFFICIENCY` of ``generation``, 1.0 where none was fitted."""
    return TRAINING_EFFICIENCY.get(generation, 1.0)


#: The reduction depth ``k`` at which a GEMM reaches half its best-shape rate, read off ``matmul.depth128``.
DEPTH_FIGURE_K = 128


def depth_half() -> float:
    """``k_half`` of :func:`gemm_efficiency`: the depth at which a GEMM runs at half its best-shape rate, solved from
    the one published shallow GEMM (``matmul.depth128``): ``c = k / (k + k_half)`` at ``k = 128``."""
    return DEPTH_FIGURE_K * (1 / constant("matmul.depth128") - 1)


def gemm_efficiency(precision: str, generation: str, k: float, part: str = "") -> float:
    """The fraction of peak a GEMM of reduction depth ``k`` reaches: the best-shape figure of
    :func:`matmul_efficiency` (of ``part``, where it has its own) times ``k / (k + k_half)`` (:func:`depth_half`).

    Why the depth: each tile of the output loads its operands once and then runs ``k`` multiply-adds per element;
    a short ``k`` leaves the tensor cores waiting for loads and for the tile's prologue and epilogue. The
    attention scores of a transformer (``k`` = the head dimension, 64 to 160) are the shallow GEMMs that matter.
    Taught in ``notebooks/05c_performance_model.ipynb``.
    """
    best = matmul_efficiency(precision, generation, part)
    return best if math.isinf(k) else best * k / (k + depth_half())


def format_figures() -> str:
    """The calibration set as text: constant, value, what was measured, source."""
    lines = [f"{'constant':<24} {'value':>9}  measured / source"]
    for f in FIGURES:
        lines.append(f"{f.fits:<24} {f.constant:>9.3g}  {f.what}; {'ASSUMED: ' if f.assumed else ''}{f.source}")
    lines.append(f"{'conv.fp32':<24} {CONV_EFFICIENCY:>9.3g}  fitted to ResNet-50, 90 epochs on one M40 in 14 days "
                 "(the calibration row of the validation table)")
    for generation, value in TRAINING_EFFICIENCY.items():
        lines.append(f"{'training.' + generation:<24} {value:>9.3g}  sustained fraction of the rates above in a "
                     "transformer's training step: FITTED on the fitting set of course.perf.figures only")
    return "\n".join(lines)
