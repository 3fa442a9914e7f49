"""A performance model of data-parallel training on real GPUs: one step as a timeline, and what n GPUs buy.

Every number it returns is **modelled**, not measured. One step on each of ``n`` GPUs (per-rank batch ``B``):

    layer     = FLOPs x B / (peak at the precision x the kernel's efficiency)       (a GEMM or a convolution)
                + bytes its element-wise kernels move / (memory bandwidth x efficiency) + kernels x launch
                (backward costs 2x forward; the kernels of a layer run one after another, so their times add)
    backward  = the layers in reverse, one after another; a **bucket** of gradients (DDP's 25 MiB) is ready
                when its last layer's backward ends
    comm      = each bucket's allreduce (:mod:`course.perf.comm`) on one communication stream, in order,
                each starting when its bucket is ready and the previous one is done: a timeline, not a flag
    step      = max(end of backward, end of the last allreduce) + optimizer + framework overhead,
                or the input pipeline's time for B samples if that is longer

Gradients weigh 4 bytes per parameter in FP32 and under autocast (``precision="amp"``: its gradients stay FP32),
2 in a model kept in FP16/BF16. The efficiencies are fitted once in :mod:`course.perf.microbench`; what the
software does (precision, bucket size, optimizer, input rate) is an :class:`Assumptions` field. Two schemes put
every byte through few devices: ``naive`` (``nn.DataParallel``: device 0 scatters inputs and parameters, gathers
gradients, nothing overlaps) and ``parameter_server`` (``server_shards`` shards; pushes overlap backward bucket by
bucket, the pull of the new parameters follows). :mod:`course.perf.parallel` adds tensor, pipeline and sharded
data parallelism; :mod:`course.perf.published` checks all of it against published figures. Taught in
``notebooks/05c_performance_model.ipynb`` (and its picture in ``notebooks/05_ddp.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from course.arguments import check_choice, check_count
from course.perf import microbench
from course.perf.catalog import Gpu
from course.perf.comm import (
    Cluster,
    algorithms,
    allreduce_seconds,
    alpha_beta,
    message_seconds,
    server_phase_seconds,
    server_seconds,  # noqa: F401 (re-exported for the notebooks)
)
from course.perf.workloads import Layer, Workload

HUBS = ("naive", "parameter_server")  # schemes that move every byte through few devices


def schemes() -> tuple[str, ...]:
    """Every scheme :func:`step_time` models: the allreduces of :func:`course.perf.comm.algorithms` (read from the
    algorithm table now) and the two hub schemes."""
    return (*algorithms(), *HUBS)


SCHEMES = schemes()  # as the table stands at import
KINDS = ("compute", "communication", "data wait", "idle")  # what a modelled device is doing
PRECISIONS = ("fp32", "tf32", "amp", "fp16", "bf16")
OPTIMIZER_BYTES = {"sgd": 16.0, "adam": 28.0}  # bytes read+written per parameter by one optimizer step


@dataclass(frozen=True)
class Assumptions:
    """What the software running on the hardware does: the setup a user states, never a fitted efficiency."""

    precision: str = "fp32"            # "fp32", "tf32", "amp" (autocast), "fp16"/"bf16" (a 16-bit model)
    bucket_bytes: float = 25 * 2**20   # gradients fused per allreduce (DDP's bucket_cap_mb=25)
    optimizer: str = "sgd"             # "sgd" (momentum) or "adam": bytes one update moves per parameter
    server_shards: int = 1             # parameter_server only: shards, one per node
    samples_per_s: float = math.inf    # input pipeline rate per GPU; inf: data never waits

    @property
    def element_bytes(self) -> int:
        """Bytes of one activation element."""
        return 4 if self.precision in ("fp32", "tf32") else 2

    @property
    def gradient_element_bytes(self) -> int:
        """Bytes of one gradient element: autocast keeps FP32 weights, so FP32 gradients."""
        return 4 if self.precision in ("fp32", "tf32", "amp") else 2

    @property
    def compute_efficiency(self) -> float:
        """The fitted convolution efficiency (:data:`course.perf.microbench.CONV_EFFICIENCY`), for a quick rate."""
        return microbench.CONV_EFFICIENCY

    def __str__(self) -> str:
        data = "data never waits" if math.isinf(self.samples_per_s) else f"data at {self.samples_per_s:,.0f} samples/s"
        return (f"{self.precision} ({self.gradient_element_bytes}-byte gradients), "
                f"{self.bucket_bytes / 2**20:g} MiB buckets, {self.optimizer}; {data}")


@dataclass(frozen=True)
class Segment:
    """One modelled interval of one device: ``kind`` is one of :data:`KINDS`."""

    start_s: float
    end_s: float
    kind: str


@dataclass(frozen=True)
class StepTime:
    """One modelled step on ``world_size`` GPUs, in seconds, with each device's timeline."""

    world_size: int
    forward_s: float
    backward_s: float
    comm_s: float          # total time the allreduces (or transfers) take
    exposed_comm_s: float  # the part of it that backward does not hide
    data_s: float          # input pipeline time for one per-rank batch
    step_s: float
    timeline: dict[int, list[Segment]] = field(default_factory=dict, repr=False)
    update_s: float = 0.0  # optimizer step and per-step framework overhead

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def data_wait_s(self) -> float:
        """Time the step waits for its batch: the input pipeline is slower than everything else."""
        return max(0.0, self.step_s - self.compute_s - self.exposed_comm_s - self.update_s)


# ---- compute ----------------------------------------------------------------------------------------------

def kernel_efficiency(layer: Layer, gpu: Gpu, precision: str) -> float:
    """The fitted fraction of peak a layer's main kernel reaches: a GEMM's by precision and GPU generation, a
    convolution's from the calibration (:mod:`course.perf.microbench`)."""
    if layer.kind == "matmul":
        return microbench.matmul_efficiency(precision, gpu.generation, gpu.name)
    return microbench.CONV_EFFICIENCY


def layer_seconds(layer: Layer, batch_size: int, gpu: Gpu, a: Assumptions, factor: float = 1.0) -> float:
    """Time of one layer for ``batch_size`` samples (``factor`` 2 for its backward): math + memory + launches."""
    flops = layer.flops / 2.25 if layer.winograd and a.precision == "fp32" else layer.flops
    math_s = factor * flops * batch_size / (gpu.peak_flops(a.precision) * kernel_efficiency(layer, gpu, a.precision))
    moved = factor * layer.activations * batch_size * a.element_bytes
    memory_s = moved / (gpu.memory_bandwidth * microbench.constant("memory"))
    return math_s + memory_s + factor * layer.kernels * microbench.constant("launch")


def update_seconds(params: float, gpu: Gpu, a: Assumptions) -> float:
    """The optimizer step over ``params`` parameters (memory-bound) plus the per-step framework overhead."""
    moved = params * OPTIMIZER_BYTES[a.optimizer]
    return moved / (gpu.memory_bandwidth * microbench.constant("memory")) + microbench.constant("framework")


# ---- one step ---------------------------------------------------------------------------------------------

def step_time(workload: Workload, batch_size: int, world_size: int, cluster: Cluster, scheme: str = "ring",
              a: Assumptions = Assumptions()) -> StepTime:
    """Model one training step with per-rank ``batch_size`` on ``world_size`` GPUs (see the module docstring).

    Raises:
        ValueError: unknown scheme, precision or optimizer, or a batch size or world size below 1.
    """
    check_choice("scheme", scheme, schemes())
    check_choice("precision", a.precision, PRECISIONS)
    check_choice("optimizer", a.optimizer, tuple(OPTIMIZER_BYTES))
    batch_size = check_count("batch_size", batch_size, unit="number of samples per rank")
    world_size = check_count("world_size", world_size, unit="number of GPUs")
    forward = [layer_seconds(layer, batch_size, cluster.gpu, a) for layer in workload.layers]
    backward = [layer_seconds(layer, batch_size, cluster.gpu, a, 2.0) for layer in reversed(workload.layers)]
    data_s, update_s = batch_size / a.samples_per_s, update_seconds(workload.params, cluster.gpu, a)
    if scheme == "naive":
        return _through_one_device(workload, batch_size, world_size, cluster, a, sum(forward), sum(backward),
                                   data_s, update_s)
    ready, backward_end = bucket_ready_times(workload, sum(forward), backward, a)
    comm = _communicate(ready, world_size, cluster, scheme, a) if world_size > 1 else []
    busy = max([backward_end] + [s.end_s for s in comm]) + update_s
    step = max(busy, data_s)
    shift = step - busy  # a slow input pipeline delays the whole step: the GPU first waits for its batch
    segments = [Segment(0.0, shift, "data wait")] if shift > 0 else []
    segments += [Segment(shift, shift + backward_end, "compute")]
    segments += [Segment(s.start_s + shift, s.end_s + shift, s.kind) for s in comm]
    last = max([backward_end] + [s.end_s for s in comm])
    segments += [Segment(shift + last, step, "compute")] if update_s else []
    comm_s = sum(s.end_s - s.start_s for s in comm)
    return StepTime(world_size, sum(forward), sum(backward), comm_s, last - backward_end, data_s, step,
                    {rank: _fill_idle(sorted(segments, key=lambda s: s.start_s), step) for rank in range(world_size)},
                    update_s)


def bucket_ready_times(workload: Workload, forward_s: float, backward: list[float], a: Assumptions
                       ) -> tuple[list[tuple[float, float]], float]:
    """When each bucket of gradients is complete: ``([(seconds, bytes), ...], end of backward)``.

    Backward runs the layers in reverse; a bucket closes once ``a.bucket_bytes`` of gradients are in it, and the
    last one when backward ends (DDP fills its buckets in the same reverse order).
    """
    t, pending, ready = forward_s, 0.0, []
    for seconds, layer in zip(backward, reversed(workload.layers), strict=True):
        t, pending = t + seconds, pending + a.gradient_element_bytes * layer.params
        if pending >= a.bucket_bytes:
            ready.append((t, pending))
            pending = 0.0
    return ready + ([(t, pending)] if pending else []), t


def _communicate(ready: list[tuple[float, float]], world_size: int, cluster: Cluster, scheme: str,
                 a: Assumptions) -> list[Segment]:
    """One transfer at a time on the communication stream, each starting when its bucket is complete. For a
    parameter server the buckets are pushes, and one pull of every parameter follows the last of them."""
    segments, free = [], 0.0
    for when, nbytes in ready:
        if scheme == "parameter_server":
            seconds = server_phase_seconds(nbytes, world_size, cluster, a.server_shards)
        else:
            seconds = allreduce_seconds(nbytes, world_size, cluster, scheme)
        start = max(free, when)
        free = start + seconds
        segments.append(Segment(start, free, "communication"))
    if scheme == "parameter_server":
        pull = server_phase_seconds(sum(n for _, n in ready), world_size, cluster, a.server_shards)
        segments.append(Segment(free, free + pull, "communication"))
    return segments


def _through_one_device(workload: Workload, batch_size: int, world_size: int, cluster: Cluster, a: Assumptions,
                        forward_s: float, backward_s: float, data_s: float, update_s: float) -> StepTime:
    """``naive``: device 0 sends each replica its inputs and the parameters, then receives its gradients, one
    replica after another over device 0's link; nothing overlaps."""
    link = alpha_beta(cluster.intra if cluster.nodes(world_size) == 1 else cluster.inter)
    others, grads = world_size - 1, workload.gradient_bytes(a.gradient_element_bytes)
    send = message_seconds(grads + batch_size * workload.sample_bytes, link)  # parameters and inputs
    receive = message_seconds(grads, link)
    before, after, compute = others * send, others * receive, forward_s + backward_s
    start = max(before, data_s)
    step = start + compute + after + update_s
    turns = (send, receive, start + compute)
    timeline = {rank: _hub_timeline(rank, turns, before, start, compute, step) for rank in range(world_size)}
    return StepTime(world_size, forward_s, backward_s, before + after, before + after, data_s, step, timeline,
                    update_s)


def _hub_timeline(rank: int, turns: tuple[float, float, float], before: float, start: float, compute: float,
                  step: float) -> list[Segment]:
    """One device's step when every transfer queues on device 0's link: device 0 talks the whole time the link
    is busy; every other device only during its own turn, idle while it waits for it."""
    send, receive, after_compute = turns
    if rank == 0:
        talk = [Segment(0.0, before, "communication"),
                Segment(after_compute, after_compute + (before / send if send else 0) * receive, "communication")]
    else:
        turn = rank - 1
        talk = [Segment(turn * send, (turn + 1) * send, "communication"),
                Segment(after_compute + turn * receive, after_compute + (turn + 1) * receive, "communication")]
    segments = sorted([*talk, Segment(start, start + compute, "compute")], key=lambda s: s.start_s)
    return _fill_idle([s for s in segments if s.end_s > s.start_s], step)


def _fill_idle(segments: list[Segment], end_s: float) -> list[Segment]:
    """The segments with the gaps between them (and up to ``end_s``) marked idle."""
    filled, t = [], 0.0
    for segment in segments:
        if segment.start_s > t + 1e-15:
            filled.append(Segment(t, segment.start_s, "idle"))
        filled.append(segment)
        t = max(t, segment.end_s)
    return filled + ([Segment(t, end_s, "idle")] if end_s > t + 1e-15 else [])


def scaling_curve(workload: Workload, batch_size: int | None, world_sizes: tuple[int, ...], cluster: Cluster,
                  scheme: str = "ring", a: Assumptions = Assumptions(), *,
                  global_batch_size: int | None = None) -> dict[int, dict]:
    """Speedup and scaling efficiency over 1 GPU, for each world size.

    Args:
        batch_size: per-rank batch size at every world size (weak scaling), or None with ``global_batch_size``: one
            global batch split over the ranks at every world size (strong scaling). Give one of the two.

    Returns:
        ``{world_size: {"step": StepTime, "speedup": x, "efficiency": speedup / world_size}}``.
    """
    if (batch_size is None) == (global_batch_size is None):
        raise ValueError(f"give either batch_size (per rank, weak scaling) or global_batch_size (strong scaling), got "
                         f"batch_size={batch_size!r} and global_batch_size={global_batch_size!r}.")
    strong = global_batch_size is not None

    def per_rank(world_size: int) -> int:
        return max(1, global_batch_size // world_size) if strong else batch_size

    one = step_time(workload, per_rank(1), 1, cluster, scheme, a).step_s
    curve = {}
    for world_size in world_sizes:
        step = step_time(workload, per_rank(world_size), world_size, cluster, scheme, a)
        speedup = (one if strong else world_size * one) / step.step_s
        curve[world_size] = {"step": step, "speedup": speedup, "efficiency": speedup / world_size}
    return curve


def to_history(step: StepTime, steps: int = 3, samples_per_step: int = 50) -> object:
    """The timeline as a :class:`course.monitor.sampling.History` of kind ``"modelled"``, which
    ``course.monitor.summary_plot`` can replay. Utilization of a device = percent of each sampling interval it
    spends computing."""
    from course.monitor.sampling import History, Reading

    interval = step.step_s / samples_per_step
    history = History("modelled", {rank: f"modelled GPU {rank}: percent of time computing (not a measurement)"
                                   for rank in step.timeline})
    for i in range(steps * samples_per_step):
        t0 = i * interval
        for rank, segments in step.timeline.items():
            offset = (t0 // step.step_s) * step.step_s
            busy = sum(max(0.0, min(s.end_s + offset, t0 + interval) - max(s.start_s + offset, t0))
                       for s in segments if s.kind == "compute")
            history.readings.append(Reading(t0, rank, 100.0 * busy / interval, 0))
    return history
