"""A profiler trace of one DDP step, read back from the trace file: per-rank timeline, overlap, and MFU.

Each rank trains a small MLP under DDP (buckets small enough that there are several), runs a few warm-up steps,
then profiles one step with ``torch.profiler`` and exports a Chrome/Perfetto trace (``rank<r>.json``; open it
in ``chrome://tracing`` or https://ui.perfetto.dev, both work offline on a local file). :func:`read_trace`
reads the timeline back *from that file's events*: the ``forward``/``backward``/``optimizer`` ranges the step
labels with ``record_function``, the end of the last gradient (the last ``AccumulateGrad``), and every
allreduce: one per bucket.

Which events are the communication depends on the backend. On gloo, the ``gloo:all_reduce`` ranges of gloo's own
threads are: those threads move and add the data. On NCCL, the CPU's ``nccl:all_reduce`` range only enqueues a
kernel on a CUDA stream, and returns; the communication is that kernel, ``ncclDevKernel_AllReduce...``
(``ncclKernel_...`` in older NCCL), which the profiler records on the GPU with CUDA activity on. So on a GPU the
step ends with ``torch.cuda.synchronize`` (otherwise the ranges would time how fast Python issued kernels), the
allreduces are NCCL's kernels and the other kernels are the compute stream's. A NCCL trace without kernels has no
communication time to read, and :func:`read_trace` refuses it.

:func:`overlap_fraction` is the share of allreduce time spent while gradients were still being computed (on a
GPU: while a compute kernel ran); :func:`modelled_overlap` reads the same share off
:func:`course.perf.model.step_time`'s timeline. :func:`mfu` divides the step's model FLOPs by its time and the
GPU's datasheet peak (:func:`datasheet_peak_flops`); :func:`matmul_fraction` divides by a measured matmul rate
instead, the only peak there is on a CPU. Taught in ``notebooks/09b_profiling_and_pitfalls.ipynb``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import world
from course.perf import catalog, workloads
from course.perf.comm import Cluster
from course.perf.model import Assumptions, StepTime, step_time

PHASES = ("forward", "backward", "optimizer")  # the record_function labels of one step
ALLREDUCE_EVENTS = ("gloo:all_reduce",)  # what gloo's threads record per bucket: the communication itself
NCCL_ENQUEUE = "nccl:"  # the CPU's ranges on NCCL: a kernel enqueued on a stream, not the communication
LAST_GRADIENT = "torch::autograd::AccumulateGrad"
#: NCCL's kernels' names start so: ncclDevKernel_AllReduce_Sum_f32_RING_LL (NCCL 2.19 on), ncclKernel_... (before)
COMMUNICATION_KERNELS = ("ncclDevKernel_", "ncclKernel_")


@dataclass(frozen=True)
class Setup:
    """The profiled run: an MLP of ``depth`` square ``width`` layers, per-rank ``batch_size``, DDP buckets."""

    width: int = 256
    depth: int = 6
    batch_size: int = 64          # per rank
    bucket_cap_mb: float = 0.3    # about one layer's gradients (0.26 MB) per bucket: several buckets
    warmup_steps: int = 3         # DDP rebuilds its buckets after the first step; profile after that

    def workload(self) -> workloads.Workload:
        """The MLP as :mod:`course.perf` sees it (FLOPs and parameters per layer)."""
        layers = tuple(workloads.linear(f"fc{i}", self.width, self.width) for i in range(self.depth))
        return workloads.Workload("MLP", layers, sample_bytes=4.0 * self.width)

    def step_flops(self) -> float:
        """Model FLOPs of one training step on one rank: forward + backward (2x forward) = 3x forward."""
        return 3.0 * self.workload().flops * self.batch_size


@dataclass(frozen=True)
class Interval:
    name: str
    start_s: float  # from the start of the step's forward
    end_s: float


@dataclass(frozen=True)
class Timeline:
    """One rank's profiled step, read from its trace file."""

    rank: int
    phases: dict[str, Interval]
    gradients_done_s: float         # end of the last AccumulateGrad: backward's compute is over
    allreduces: list[Interval] = field(default_factory=list)  # on a GPU: NCCL's kernels
    compute: list[Interval] = field(default_factory=list)     # on a GPU: the other kernels; empty on a CPU

    @property
    def step_s(self) -> float:
        """From the start of forward to the end of the optimizer range (which, on a GPU, waits for its kernels)."""
        return max([self.phases["optimizer"].end_s] + [k.end_s for k in self.compute + self.allreduces])


def _model(setup: Setup) -> nn.Module:
    return nn.Sequential(*[nn.Linear(setup.width, setup.width) for _ in range(setup.depth)])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a GPU runs kernels after Python issued them: wait before reading a clock


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    with torch.profiler.record_function("forward"):
        loss = model(inputs).pow(2).mean()
    with torch.profiler.record_function("backward"):
        loss.backward()
    with torch.profiler.record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad()
        _synchronize(inputs.device)  # the step is over when the GPU is done, not when its kernels were issued


def activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    """What the profiler records on ``device``: the CPU's activity, and CUDA's kernels on a GPU."""
    cuda = [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    return [torch.profiler.ProfilerActivity.CPU, *cuda]


def measured_peak_flops(n: int | None = None, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """The best matmul rate (FLOP/s) on ``n x n`` float32 matrices on ``device`` (default ``n``: 384 on a CPU,
    4096 on a GPU, which a small matmul leaves mostly idle). Not a datasheet peak: see :func:`matmul_fraction`."""
    device = torch.device(device)
    n = n or (4096 if device.type == "cuda" else 384)
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        a @ b
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


def datasheet_peak_flops(device_name: str | None, precision: str = "fp32") -> tuple[str, float] | None:
    """``(catalog name, peak FLOP/s)`` of the GPU CUDA calls ``device_name`` (:func:`course.perf.catalog.match_gpu`),
    or None for a CPU (``device_name`` None) or a GPU the catalog does not list. FP32 by default: PyTorch's float32
    matmuls do not use TF32 unless ``torch.backends.cuda.matmul.allow_tf32`` is set."""
    gpu = catalog.match_gpu(device_name) if device_name else None
    return (gpu.name, gpu.peak_flops(precision)) if gpu else None


def profile_ddp_step(trace_dir: str, setup: Setup = Setup()) -> dict:
    """Rank function: warm up, profile one DDP step, export ``<trace_dir>/rank<r>.json``.

    Returns:
        ``{"trace": path, "buckets": buckets DDP reduced per step, "device", "gpu": CUDA's name for it (None on a
        CPU), "matmul_flops": this rank's measured matmul rate, "datasheet": (GPU, peak FLOP/s) or None}``.
    """
    rank = world.current()
    torch.manual_seed(0)
    model = DDP(_model(setup).to(rank.device), bucket_cap_mb=setup.bucket_cap_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(setup.batch_size, setup.width, device=rank.device)
    for _ in range(setup.warmup_steps):
        _step(model, optimizer, inputs)
    with torch.profiler.profile(activities=activities(rank.device)) as profiler:
        _step(model, optimizer, inputs)
    path = Path(trace_dir) / f"rank{rank.rank}.json"
    profiler.export_chrome_trace(str(path))
    buckets = int(model._get_ddp_logging_data()["num_buckets_reduced"])
    name = torch.cuda.get_device_name(rank.device) if rank.device.type == "cuda" else None
    return {"trace": str(path), "buckets": buckets, "device": str(rank.device), "gpu": name,
            "matmul_flops": measured_peak_flops(device=rank.device), "datasheet": datasheet_peak_flops(name)}


def read_trace(path: str | Path, rank: int = 0) -> Timeline:
    """Read one rank's step back from its Chrome trace: phases, end of the last gradient, allreduces.

    Raises:
        ValueError: the trace has no ``forward``/``backward``/``optimizer`` range (not a trace this module wrote),
            or it is a NCCL trace without CUDA kernels (its ``nccl:`` ranges are enqueues, not communication).
    """
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    ranges = {e["name"]: e for e in events if e["name"] in PHASES}
    if set(ranges) != set(PHASES):
        raise ValueError(f"{path} should hold the ranges {PHASES}, found {sorted(ranges)}; write it with "
                         "profile_ddp_step.")
    t0 = ranges["forward"]["ts"]
    end = ranges["optimizer"]["ts"] + ranges["optimizer"]["dur"]

    def interval(e: dict) -> Interval:
        return Interval(e["name"], (e["ts"] - t0) / 1e6, (e["ts"] + e["dur"] - t0) / 1e6)

    grads = [e["ts"] + e["dur"] for e in events if e["name"] == LAST_GRADIENT]
    kernels = [e for e in events if e.get("cat") == "kernel" and t0 <= e["ts"] <= end]
    communication = [e for e in kernels if e["name"].startswith(COMMUNICATION_KERNELS)]
    if kernels:  # a GPU's: its allreduces are NCCL's kernels, and the rest the compute stream's
        allreduces = [interval(e) for e in communication]
        compute = [interval(e) for e in kernels if not e["name"].startswith(COMMUNICATION_KERNELS)]
    elif any(e["name"].startswith(NCCL_ENQUEUE) for e in events):
        raise ValueError(f"{path} was recorded on NCCL without CUDA activity: its nccl: ranges are the CPU enqueuing "
                         "kernels, not the communication. Profile with activities(device), which adds "
                         "ProfilerActivity.CUDA.")
    else:
        allreduces = [interval(e) for e in events if e["name"] in ALLREDUCE_EVENTS and t0 <= e["ts"] <= end]
        compute = []
    return Timeline(rank, {name: interval(e) for name, e in ranges.items()}, (max(grads) - t0) / 1e6,
                    sorted(allreduces, key=lambda i: i.start_s), sorted(compute, key=lambda i: i.start_s))


def _inside(intervals: list[Interval], start_s: float, end_s: float) -> float:
    """Fraction of the intervals' total length that falls inside ``[start_s, end_s]`` (0 if they are empty)."""
    total = sum(i.end_s - i.start_s for i in intervals)
    inside = sum(max(0.0, min(i.end_s, end_s) - max(i.start_s, start_s)) for i in intervals)
    return inside / total if total > 0 else 0.0


def _covered(intervals: list[Interval], cover: list[Interval]) -> float:
    """Fraction of the intervals' total length during which some interval of ``cover`` runs too."""
    total = sum(i.end_s - i.start_s for i in intervals)
    merged: list[list[float]] = []
    for c in sorted(cover, key=lambda c: c.start_s):
        if merged and c.start_s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], c.end_s)
        else:
            merged.append([c.start_s, c.end_s])
    inside = sum(max(0.0, min(i.end_s, end) - max(i.start_s, start)) for i in intervals for start, end in merged)
    return inside / total if total > 0 else 0.0


def overlap_fraction(timeline: Timeline) -> float:
    """Share of the allreduce time that ran while gradients were still being computed (0 to 1): on a GPU, while
    a compute kernel ran beside the communication kernel; on a CPU, inside backward before its last gradient."""
    if timeline.compute:
        return _covered(timeline.allreduces, timeline.compute)
    return _inside(timeline.allreduces, timeline.phases["backward"].start_s, timeline.gradients_done_s)


def modelled_step(setup: Setup = Setup(), gpu: str = "A100 SXM4", link: str = "NVLink 3 (A100, 12 links)",
                  world_size: int = 2) -> StepTime:
    """:func:`course.perf.model.step_time` for the same MLP, batch and bucket size on ``world_size`` GPUs."""
    cluster = Cluster(catalog.gpu(gpu), catalog.link(link))
    return step_time(setup.workload(), setup.batch_size, world_size, cluster, "ring",
                     Assumptions(bucket_bytes=setup.bucket_cap_mb * 2**20))


def modelled_overlap(step: StepTime) -> float:
    """Share of the modelled allreduce time inside the modelled backward (rank 0's timeline)."""
    comm = [Interval("allreduce", s.start_s, s.end_s) for s in step.timeline[0] if s.kind == "communication"]
    return _inside(comm, step.forward_s, step.forward_s + step.backward_s)


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilization: ``flops / seconds / peak_flops``, with the hardware's datasheet peak
    (:func:`datasheet_peak_flops`).

    Raises:
        ValueError: a time or peak that is not positive.
    """
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"seconds and peak_flops should be positive, got {seconds} and {peak_flops}")
    return flops / seconds / peak_flops


def matmul_fraction(flops: float, seconds: float, matmul_flops: float) -> float:
    """The step's FLOP rate as a share of a measured matmul's (:func:`measured_peak_flops`): not an MFU, which
    divides by the datasheet peak, but the only comparison a CPU offers.

    Raises:
        ValueError: a time or rate that is not positive.
    """
    return mfu(flops, seconds, matmul_flops)


def draw(timelines: list[Timeline]):  # -> matplotlib Figure
    """Each rank's step as two rows: compute (forward, backward, optimizer) and its allreduces, in ms."""
    import matplotlib.pyplot as plt

    colours = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}
    figure, axes = plt.subplots(len(timelines), 1, figsize=(9, 1.4 * len(timelines)), sharex=True, squeeze=False)
    for ax, t in zip(axes[:, 0], timelines, strict=True):
        for name, i in t.phases.items():
            ax.broken_barh([(i.start_s * 1e3, (i.end_s - i.start_s) * 1e3)], (1, 0.8), color=colours[name],
                           label=name)
        ax.axvline(t.gradients_done_s * 1e3, color="black", lw=1, ls=":", label="last gradient")
        ax.broken_barh([(i.start_s * 1e3, (i.end_s - i.start_s) * 1e3) for i in t.allreduces], (0, 0.8),
                       color="tab:red", edgecolor="white", label="allreduce (one per bucket)")
        ax.set_yticks([0.4, 1.4], ["comm", "compute"])
        ax.set_ylabel(f"rank {t.rank}")
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axes[-1, 0].set_xlabel("ms from the start of forward (read from the trace files)")
    figure.tight_layout()
    return figure


def describe_allreduces(timeline: Timeline) -> str:
    """One rank's allreduces in words: their summed time, the wall time they span, and their overlap with backward.

    The allreduces run on the backend's threads, side by side with backward and with each other, so their summed
    time can exceed the step; the words say so when it does (notebook 09b).
    """
    total = sum(a.end_s - a.start_s for a in timeline.allreduces)
    spanned = _union(timeline.allreduces)
    text = (f"rank {timeline.rank}: step {timeline.step_s * 1e3:.1f} ms, {len(timeline.allreduces)} allreduces "
            f"{total * 1e3:.1f} ms summed, spanning {spanned * 1e3:.1f} ms of wall time; "
            f"{overlap_fraction(timeline):.0%} of their time ran while gradients were still being computed (measured)")
    if total > timeline.step_s:
        text += ". The sum exceeds the step: they ran at the same time as each other and as backward"
    return text


def _union(intervals: list[Interval]) -> float:
    """The length of time covered by at least one of ``intervals``."""
    covered, end = 0.0, float("-inf")
    for interval in sorted(intervals, key=lambda i: i.start_s):
        covered += max(0.0, interval.end_s - max(interval.start_s, end))
        end = max(end, interval.end_s)
    return covered
