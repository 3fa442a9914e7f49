"""Speed graded without a GPU: a DDP-by-hand bucket schedule, recorded on CPUs, timed by the model on a real cluster.

The DDP lab (``notebooks/04b_distributed_optimizer.ipynb``) records each step of the student's ``MyDDP``: when each
gradient became ready and its bytes, and when each allreduce was launched and waited for. CPU seconds say little
about a GPU, so :func:`from_record` keeps only the *order* of events: which gradient each allreduce followed,
whether it waited for backward to end, and whether backward waited for it. That is a :class:`Schedule`.

:func:`step_time` replays a schedule on a named cluster (:data:`CLUSTERS`). Each gradient's tensor is priced as a
linear layer's weight: its backward is ``4·B·params`` FLOPs (twice its forward's ``2·B·params``) at the GEMM
efficiency, plus two kernel launches. Allreduces run one at a time on one communication stream, each at the
faster of ring and tree (NCCL's tuner picks per message size). A launch waits for its gradient; backward waits
for an allreduce that the student waited for inside a hook. The step ends when backward and the last allreduce
are done, plus the optimizer step and the framework's overhead (:func:`course.perf.model.update_seconds`).

:func:`ddp_schedule` is what torch's ``DistributedDataParallel`` does with its defaults on the same gradients:
a first bucket of 1 MiB, then buckets of 25 MiB, each launched as soon as its last gradient is ready
(``torch/nn/parallel/distributed.py``: ``dist._DEFAULT_FIRST_BUCKET_BYTES`` and ``bucket_cap_mb=25``).
:func:`compare` gives both. Every number is **modelled**. Taught in ``notebooks/04b_distributed_optimizer.ipynb``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course.perf import catalog
from course.perf import model as pm
from course.perf.comm import Cluster
from course.perf.workloads import Layer

DDP_BUCKET_BYTES = 25 * 2**20        # torch DDP's bucket_cap_mb=25
DDP_FIRST_BUCKET_BYTES = 2**20       # torch's dist._DEFAULT_FIRST_BUCKET_BYTES: the first bucket is smaller
_H100 = catalog.gpu("H100 SXM5")
_NVSWITCH = catalog.link("NVSwitch (H100, NVLink 4)")

#: Named clusters: (the cluster, how many GPUs train). A DGX H100 has 8 GPUs on NVSwitch and 8 NDR adapters.
CLUSTERS: dict[str, tuple[Cluster, int]] = {
    "8 H100s over NVLink": (Cluster(_H100, _NVSWITCH, 8), 8),
    "4 nodes over InfiniBand": (Cluster(_H100, _NVSWITCH, 8, catalog.link("InfiniBand NDR"), 8), 32),
}


@dataclass(frozen=True)
class Launch:
    """One allreduce of a schedule.

    Attributes:
        nbytes: the bucket's bytes.
        after_gradients: how many gradients backward had produced when it was launched (0 to all of them).
        after_backward: launched only once ``loss.backward()`` had returned.
        blocking: backward waited for it to finish before producing the next gradient (a blocking call in a hook,
            or a ``wait()`` there).
    """

    nbytes: int
    after_gradients: int
    after_backward: bool = False
    blocking: bool = False


@dataclass(frozen=True)
class Schedule:
    """A step's bucket schedule: each gradient's bytes in the order backward produced them, and the allreduces in
    the order they were launched."""

    gradient_bytes: tuple[int, ...]
    launches: tuple[Launch, ...]


@dataclass(frozen=True)
class ModelledStep:
    """One schedule's modelled step on one cluster, in seconds."""

    cluster: str
    step_s: float
    compute_s: float         # forward, backward and the optimizer step
    comm_s: float            # all the allreduces together
    exposed_comm_s: float    # the part of the step spent only communicating or waiting for it
    allreduces: int


@dataclass(frozen=True)
class Comparison:
    """A student's schedule beside torch DDP's defaults on the same gradients and cluster."""

    student: ModelledStep
    ddp: ModelledStep

    @property
    def ratio(self) -> float:
        """The student's modelled step over DDP's: 1.0 is as fast as DDP, 2.0 twice as slow."""
        return self.student.step_s / self.ddp.step_s

    def __str__(self) -> str:
        s, d = self.student, self.ddp
        return (f"{s.cluster}: yours {s.step_s * 1e3:.3g} ms, DDP's {d.step_s * 1e3:.3g} ms per step "
                f"({self.ratio:.2f}x; {s.exposed_comm_s * 1e3:.2g} ms of your {s.allreduces} allreduces not hidden "
                "by backward)")


def from_record(gradient_bytes: Sequence[int], ready: Sequence[float], launched: Sequence[float],
                waited: Sequence[float | None], nbytes: Sequence[int], backward_end: float) -> Schedule:
    """The schedule a recorded step followed, from its clock readings (any clock; only their order counts).

    Args:
        gradient_bytes, ready: each gradient's bytes and the moment it was ready, in the order they were ready.
        launched, waited, nbytes: each allreduce's launch, the moment the student waited for it (None: never),
            and its bytes, in launch order.
        backward_end: the moment ``loss.backward()`` returned.

    Raises:
        ValueError: lists of different lengths, saying which.
    """
    if len(gradient_bytes) != len(ready) or not len(launched) == len(waited) == len(nbytes):
        raise ValueError(f"expected one ready time per gradient ({len(gradient_bytes)} sizes, {len(ready)} times) "
                         f"and one wait and size per launch ({len(launched)}, {len(waited)}, {len(nbytes)}).")
    launches = []
    for start, wait, size in zip(launched, waited, nbytes, strict=True):
        done = sum(t <= start for t in ready)
        later = [t for t in ready if t > start]
        blocking = bool(later) and wait is not None and wait < later[0]
        launches.append(Launch(int(size), done, start >= backward_end, blocking))
    return Schedule(tuple(int(n) for n in gradient_bytes), tuple(launches))


def ddp_schedule(gradient_bytes: Sequence[int], bucket_bytes: int = DDP_BUCKET_BYTES,
                 first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> Schedule:
    """torch DDP's schedule for the same gradients: buckets filled in the order gradients are ready (the first of at
    most ``first_bucket_bytes``, then ``bucket_bytes``), each launched, without waiting, once its last is ready."""
    launches, filled, cap = [], 0, first_bucket_bytes
    for index, size in enumerate(gradient_bytes):
        if filled and filled + size > cap:
            launches.append(Launch(filled, index))
            filled, cap = 0, bucket_bytes
        filled += size
    if filled:
        launches.append(Launch(filled, len(gradient_bytes)))
    return Schedule(tuple(gradient_bytes), tuple(launches))


def gradient_layer(nbytes: int) -> Layer:
    """A gradient's tensor seen as a linear layer's FP32 weight: ``2·params`` forward FLOPs per sample."""
    params = nbytes // 4
    return Layer(f"{params} parameters", 2.0 * params, params, 0.0, kernels=1, kind="matmul")


def _run(launch: Launch, t: float, free: float, world_size: int, where: Cluster) -> tuple[float, float, float]:
    """One allreduce launched at ``t`` on a stream free from ``free``: ``(backward's clock, stream free, seconds)``;
    a blocking one holds backward until it is done."""
    seconds = min(pm.allreduce_seconds(launch.nbytes, world_size, where, algorithm)
                  for algorithm in ("ring", "pipelined_tree"))
    end = max(t, free) + seconds
    return (end if launch.blocking else t), end, seconds


def step_time(schedule: Schedule, cluster: str, batch_size: int) -> ModelledStep:
    """The modelled step of ``schedule`` on the named ``cluster`` at per-rank ``batch_size`` (module docstring).

    Raises:
        KeyError: an unknown cluster, listing the known ones.
    """
    if cluster not in CLUSTERS:
        raise KeyError(f"no cluster {cluster!r}; known: {sorted(CLUSTERS)}.")
    where, world_size = CLUSTERS[cluster]
    a = pm.Assumptions()
    layers = [gradient_layer(n) for n in schedule.gradient_bytes]
    t = sum(pm.layer_seconds(layer, batch_size, where.gpu, a) for layer in layers)  # forward
    compute, free, comm, queue = t, 0.0, 0.0, list(schedule.launches)
    for done in range(len(layers) + 1):
        if done:  # backward produces gradient number `done`
            backward = pm.layer_seconds(layers[done - 1], batch_size, where.gpu, a, 2.0)
            t, compute = t + backward, compute + backward
        while queue and not queue[0].after_backward and queue[0].after_gradients <= done:
            t, free, seconds = _run(queue.pop(0), t, free, world_size, where)
            comm += seconds
    for launch in queue:  # launched once backward had returned
        t, free, seconds = _run(launch, t, free, world_size, where)
        comm += seconds
    update = pm.update_seconds(sum(layer.params for layer in layers), where.gpu, a)
    step = max(t, free) + update
    return ModelledStep(cluster, step, compute + update, comm, step - compute - update, len(schedule.launches))


def compare(schedule: Schedule, cluster: str, batch_size: int) -> Comparison:
    """``schedule`` beside torch DDP's defaults (:func:`ddp_schedule`) on the same gradients and ``cluster``."""
    return Comparison(step_time(schedule, cluster, batch_size),
                      step_time(ddp_schedule(schedule.gradient_bytes), cluster, batch_size))


@dataclass(frozen=True)
class SpeedGrading:
    """How a lab scores the modelled speed of a schedule: informational unless an instructor gives it points.

    Attributes:
        points: points for a schedule within ``within`` times DDP's modelled step; 0 reports it without scoring.
        within: the largest ratio of the student's modelled step to DDP's that passes.
        cluster: one of :data:`CLUSTERS`.
    """

    points: int = 0
    within: float = 2.0
    cluster: str = "8 H100s over NVLink"

    def judge(self, comparison: Comparison) -> bool:
        """Whether the schedule passes: its modelled step at most ``within`` times DDP's."""
        return comparison.ratio <= self.within
