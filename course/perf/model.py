"""A performance model of data-parallel training on real GPUs: what one step costs, and what n GPUs buy.

It stays one module of ~300 lines because every function is a term of the one step formula below (layer,
comm, the one-link schemes, step) or reads its result (scaling curve, timeline), checked against it in one place.

Every number it returns is **modelled**, not measured. One step on each of ``n`` GPUs (per-rank batch ``B``):

    layer  = max(FLOPs x B / (peak x compute_efficiency), bytes moved / (memory bandwidth x memory_efficiency))
             + kernels x launch overhead                      (roofline; backward costs 2x forward)
    comm   = the allreduce of the gradients, course.collectives.cost_model's alpha-beta cost per algorithm: ``ring``,
             ``tree``, or ``hierarchical`` (a ring inside each node, then a ring between nodes); in buckets
             that start as soon as their gradients exist, so they overlap the rest of backward
    step   = max(forward + backward + comm not hidden, input pipeline time for B samples)

Two schemes put every byte through one device and are modelled as such: ``naive`` (``nn.DataParallel``: device 0
scatters the inputs and the parameters, then gathers the gradients, nothing overlaps) and ``parameter_server``
(every worker pushes its gradients to one server and pulls the parameters back through the server's link).

The hardware comes from :mod:`course.perf.catalog` (cited peaks); how much of a peak a step reaches is an
:class:`Assumptions` field, stated, never hidden. The per-layer work of the published
models and of the course's DigitsCNN comes from :mod:`course.perf.workloads`; :mod:`course.perf.published` checks
the model against published figures. Taught in ``notebooks/05_ddp.ipynb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from course.arguments import check_choice, check_count
from course.collectives import cost_model
from course.perf.catalog import Gpu, Link
from course.perf.workloads import Layer, Workload

# the flat allreduces of course.collectives.allreduce.ALGORITHMS ("naive" here is nn.DataParallel's hub, below)
SCHEMES = (*(name for name in cost_model.ALGORITHMS if name != "naive"), "hierarchical", "naive", "parameter_server")
KINDS = ("compute", "communication", "data wait", "idle")  # what a modelled device is doing


@dataclass(frozen=True)
class Assumptions:
    """What the model assumes about the software running on the hardware: inputs, not measurements, not cited.

    ``compute_efficiency`` is the value under which whole ImageNet runs on one M40 and on 8 P100 both fit
    (:mod:`course.perf.published`, rows 3 and 5): it is calibrated there, not predicted. ``link_efficiency``
    is checked by the nccl-tests row. The others are orders of magnitude, to be replaced by your own numbers.
    """

    compute_efficiency: float = 1 / 3  # fraction of peak FLOP/s that convolution and matmul kernels reach
    memory_efficiency: float = 0.7     # fraction of peak memory bandwidth an elementwise kernel reaches
    launch_s: float = 5e-6             # launch and scheduling overhead of one kernel, seconds
    link_efficiency: float = 0.7       # fraction of a link's peak bandwidth that an allreduce sustains
    alpha_s: float = 10e-6             # latency of one message step of an allreduce, seconds
    precision: str = "fp32"            # "fp32", "tf32" or "fp16" (mixed precision): which peak compute uses
    bucket_bytes: float = 25 * 2**20   # gradients fused per allreduce (DDP's bucket_cap_mb=25)
    overlap: bool = True               # buckets start during backward (DDP, Horovod) or after it
    samples_per_s: float = math.inf    # input pipeline rate per GPU; inf: data never waits

    @property
    def element_bytes(self) -> int:
        return 4 if self.precision in ("fp32", "tf32") else 2

    def __str__(self) -> str:
        data = "data never waits" if math.isinf(self.samples_per_s) else f"data at {self.samples_per_s:,.0f} samples/s"
        return (f"{self.precision} compute at {self.compute_efficiency:.0%} of peak, memory traffic at "
                f"{self.memory_efficiency:.0%} of peak bandwidth, {self.launch_s * 1e6:g} µs per kernel launch; "
                f"links at {self.link_efficiency:.0%} of their bandwidth, {self.alpha_s * 1e6:g} µs per message; "
                f"{self.bucket_bytes / 2**20:g} MiB buckets{' overlapping backward' if self.overlap else ''}; {data}")


@dataclass(frozen=True)
class Cluster:
    """GPUs of one kind, ``gpus_per_node`` to a node joined by ``intra``; nodes joined by ``inter``."""

    gpu: Gpu
    intra: Link
    gpus_per_node: int = 8
    inter: Link | None = None  # None: a single node

    def nodes(self, world_size: int) -> int:
        """Nodes that ``world_size`` GPUs fill, with a clear error if they do not fit."""
        nodes = math.ceil(world_size / self.gpus_per_node)
        if nodes > 1 and self.inter is None:
            raise ValueError(f"{world_size} GPUs need {nodes} nodes of {self.gpus_per_node}, but the cluster has "
                             "no inter-node link; pass inter=hardware.link('InfiniBand HDR') or similar.")
        return nodes


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
    comm_s: float          # total time the allreduce (or transfers) take
    exposed_comm_s: float  # the part of it that backward does not hide
    data_s: float          # input pipeline time for one per-rank batch
    step_s: float
    timeline: dict[int, list[Segment]] = field(default_factory=dict, repr=False)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def data_wait_s(self) -> float:
        """Time the step waits for its batch: the input pipeline is slower than compute and exposed comm."""
        return max(0.0, self.step_s - self.compute_s - self.exposed_comm_s)


# ---- the model --------------------------------------------------------------------------------------------

def layer_seconds(layer: Layer, batch_size: int, gpu: Gpu, a: Assumptions, factor: float = 1.0) -> float:
    """Roofline time of one layer for ``batch_size`` samples (``factor`` 2 for its backward)."""
    math_s = factor * layer.flops * batch_size / (gpu.peak_flops(a.precision) * a.compute_efficiency)
    moved = factor * (layer.activations * batch_size * a.element_bytes + 4 * layer.params)
    memory_s = moved / (gpu.memory_bandwidth * a.memory_efficiency)
    return max(math_s, memory_s) + factor * layer.kernels * a.launch_s


def alpha_beta(link: Link, a: Assumptions) -> cost_model.AlphaBeta:
    """The link as the alpha-beta model sees it: sustained bandwidth = peak x ``link_efficiency``."""
    return cost_model.AlphaBeta(alpha_s=a.alpha_s, beta_s_per_byte=1.0 / (link.bandwidth * a.link_efficiency))


def message_seconds(nbytes: float, link: cost_model.AlphaBeta) -> float:
    """One message of ``nbytes`` over one link: ``α + N·β``."""
    return link.alpha_s + nbytes * link.beta_s_per_byte


def server_seconds(nbytes: float, workers: int, link: cost_model.AlphaBeta) -> float:
    """A parameter server's exchange: ``workers`` push ``nbytes`` of gradients, then pull ``nbytes`` of
    parameters, one after another over the server's one link: ``2 · workers · (α + N·β)``."""
    return 2 * workers * message_seconds(nbytes, link)


def allreduce_seconds(nbytes: float, world_size: int, cluster: Cluster, scheme: str, a: Assumptions) -> float:
    """One allreduce of ``nbytes`` on ``world_size`` GPUs (``ring``, ``tree`` or ``hierarchical``).

    Flat ``ring``/``tree`` run at the slowest link they cross; ``hierarchical`` is a ring inside each node
    (``gpus_per_node`` GPUs on ``intra``) plus a ring between nodes on ``inter``, one adapter per node.
    """
    if scheme == "naive" or scheme not in (*cost_model.ALGORITHMS, "hierarchical"):
        raise ValueError(f"allreduce scheme must be one of {sorted(set(cost_model.ALGORITHMS) - {'naive'})} or "
                         f"'hierarchical', got {scheme!r}.")
    nodes = cluster.nodes(world_size)
    if nodes == 1:
        return float(cost_model.predict("ring" if scheme == "hierarchical" else scheme, nbytes, world_size,
                                        alpha_beta(cluster.intra, a)))
    if scheme == "hierarchical":
        per_node = min(world_size, cluster.gpus_per_node)
        inside = cost_model.predict("ring", nbytes, per_node, alpha_beta(cluster.intra, a))
        return float(inside + cost_model.predict("ring", nbytes, nodes, alpha_beta(cluster.inter, a)))
    slowest = min((cluster.intra, cluster.inter), key=lambda link: link.bandwidth)
    return float(cost_model.predict(scheme, nbytes, world_size, alpha_beta(slowest, a)))


def step_time(workload: Workload, batch_size: int, world_size: int, cluster: Cluster, scheme: str = "ring",
              a: Assumptions = Assumptions()) -> StepTime:
    """Model one training step with per-rank ``batch_size`` on ``world_size`` GPUs (see the module docstring).

    Raises:
        ValueError: unknown scheme, or a batch size or world size below 1.
    """
    check_choice("scheme", scheme, SCHEMES)
    batch_size = check_count("batch_size", batch_size, unit="number of samples per rank")
    world_size = check_count("world_size", world_size, unit="number of GPUs")
    forward = [layer_seconds(layer, batch_size, cluster.gpu, a) for layer in workload.layers]
    backward = [layer_seconds(layer, batch_size, cluster.gpu, a, 2.0) for layer in reversed(workload.layers)]
    data_s = batch_size / a.samples_per_s
    if scheme in ("naive", "parameter_server"):
        return _through_one_device(workload, batch_size, world_size, cluster, scheme, a, sum(forward),
                                   sum(backward), data_s)
    ready, backward_end = _buckets(workload, sum(forward), backward, a.bucket_bytes)
    comm = _allreduce_buckets(ready, backward_end, world_size, cluster, scheme, a) if world_size > 1 else []
    busy = max([backward_end] + [s.end_s for s in comm])
    step = max(busy, data_s)
    shift = step - busy  # a slow input pipeline delays the whole step: the GPU first waits for its batch
    segments = [Segment(0.0, shift, "data wait")] if shift > 0 else []
    segments += [Segment(shift, shift + backward_end, "compute")]
    segments += [Segment(s.start_s + shift, s.end_s + shift, s.kind) for s in comm]
    comm_s = sum(s.end_s - s.start_s for s in comm)
    return StepTime(world_size, sum(forward), sum(backward), comm_s, busy - backward_end, data_s, step,
                    {rank: segments for rank in range(world_size)})


def _buckets(workload: Workload, forward_s: float, backward: list[float], bucket_bytes: float
             ) -> tuple[list[tuple[float, float]], float]:
    """When each bucket of gradients is complete: ``([(seconds, bytes), ...], end of backward)``.

    Backward runs the layers in reverse; a bucket closes once ``bucket_bytes`` of gradients are in it, and the
    last one when backward ends (DDP fills its buckets in the same reverse order).
    """
    t, pending, ready = forward_s, 0.0, []
    for seconds, layer in zip(backward, reversed(workload.layers), strict=True):
        t, pending = t + seconds, pending + 4.0 * layer.params
        if pending >= bucket_bytes:
            ready.append((t, pending))
            pending = 0.0
    return ready + ([(t, pending)] if pending else []), t


def _allreduce_buckets(ready: list[tuple[float, float]], backward_end: float, world_size: int, cluster: Cluster,
                       scheme: str, a: Assumptions) -> list[Segment]:
    """One allreduce at a time, each starting when its bucket is complete (or after backward, without overlap)."""
    segments, free = [], 0.0
    for when, nbytes in ready:
        start = max(free, when if a.overlap else backward_end)
        free = start + allreduce_seconds(nbytes, world_size, cluster, scheme, a)
        segments.append(Segment(start, free, "communication"))
    return segments


def _through_one_device(workload: Workload, batch_size: int, world_size: int, cluster: Cluster, scheme: str,
                        a: Assumptions, forward_s: float, backward_s: float, data_s: float) -> StepTime:
    """``naive``: device 0 sends each replica its inputs and the parameters, then receives its gradients.
    ``parameter_server``: each of the ``world_size`` workers pushes gradients to and pulls parameters from
    one server over that server's one link. Either way the transfers queue on one link, and none overlaps."""
    link = alpha_beta(cluster.intra if cluster.nodes(world_size) == 1 else cluster.inter, a)
    others = world_size - 1 if scheme == "naive" else world_size  # devices served over the one link
    inputs = batch_size * workload.sample_bytes if scheme == "naive" else 0.0  # DataParallel scatters the batch
    send = message_seconds(workload.gradient_bytes + inputs, link)  # parameters (and inputs) to one device
    receive = message_seconds(workload.gradient_bytes, link)  # gradients back from one device
    before, after, compute = others * send, others * receive, forward_s + backward_s
    start = max(before, data_s)
    step = start + compute + after
    turns = (send, receive, start + compute)
    timeline = {rank: _hub_timeline(rank, scheme, turns, before, start, compute, step) for rank in range(world_size)}
    return StepTime(world_size, forward_s, backward_s, before + after, before + after, data_s, step, timeline)


def _hub_timeline(rank: int, scheme: str, turns: tuple[float, float, float], before: float, start: float,
                  compute: float, step: float) -> list[Segment]:
    """One device's step when every transfer queues on one link: the hub (naive's device 0) talks the whole time
    the link is busy; every other device only during its own turn, idle while it waits for it."""
    send, receive, after_compute = turns
    if rank == 0 and scheme == "naive":
        talk = [Segment(0.0, before, "communication"), Segment(after_compute, step, "communication")]
    else:
        turn = rank - 1 if scheme == "naive" else rank  # the replicas' (or workers') order on the shared link
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
    """The timeline as a :class:`course.monitor.sampling.History` of kind ``"modelled"``:
    ``course.monitor.summary_plot`` can
    replay it. Utilization of a device = percent of each sampling interval it spends computing."""
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
