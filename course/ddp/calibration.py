"""Calibration: predict the step time of n emulated ranks on this machine from 1 and 2 ranks, then check it.

A DDP step of DigitsCNN on ``n`` single-threaded CPU processes (per-rank batch ``B``) is CPU work, forward and
backward on every rank, then one allreduce of the gradients (360 KB fit in one 25 MiB bucket, so nothing of it
overlaps backward)::

    step(n, B)   = compute(B) * max(1, n / c) + allreduce(n)
    compute(B)   = fixed + per_sample * B             one rank's step, fitted on 1 rank at >= 2 batch sizes
    c            = 2 / share(2), between 1 and the usable cores, where share(2) is how much longer the 2-rank steps
                   at the fitted batch sizes took than compute(B) + allreduce(2): the cores the ranks got
    allreduce(n) = gloo's allreduce of the N gradient bytes on n ranks, timed alone (0 on 1 rank; on 2 ranks
                   read off the α-β line fitted to all four sizes timed, which one noisy size cannot sway)

With n ranks on c < n cores the ranks take turns, so the slowest finishes its backward after n / c times its own
work. The allreduce is the term 2 ranks cannot give: the α-β ring fitted on 2 ranks (:attr:`Calibration.link`)
predicts a cost that grows with N, while gloo's 4 processes on 2 cores take a flat few milliseconds from 45 KB to
720 KB: hand-offs, not bytes, each waking a thread that then waits for a core (while writing this, 33 voluntary
context switches per call per rank on 4 ranks against 7 on 2). So it is timed alone on each rank count, and
:func:`held_out_allreduce` shows how far the α-β extrapolation misses; the 4-rank steps check the rest.

:func:`measure` times every configuration in one launch, in turns (round after round), so load that drifts
from elsewhere falls on all of them alike; :func:`fit` uses the 1-rank steps at two batch sizes, the 2-rank steps
at those batch sizes and the allreduces; :func:`held_out` predicts the steps it did not use (4 ranks, and a batch
size never fitted) beside what was measured. Taught in ``notebooks/05_ddp.ipynb``; ``benchmarks/calibration.py``
repeats it and prints the spread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import data, models, world
from course.collectives import cost_model
from course.timing import Estimate, summarize


@dataclass(frozen=True)
class Calibration:
    """The fitted model of this machine (module docstring): ``predict(n, B)`` seconds per step.

    Attributes:
        fixed_s, per_sample_s: one rank's step, ``fixed_s + per_sample_s * B`` seconds.
        link: α and β of gloo's allreduce (ring) from 2 ranks, with a core per rank: the extrapolation that
            :func:`held_out_allreduce` checks (the step does not use it).
        gradient_bytes: N, the bytes DDP allreduces per step.
        allreduce_alone_s: ``{n: seconds}``, gloo's allreduce of the N gradient bytes timed alone on n > 2 ranks
            (on 2 ranks :meth:`allreduce_s` reads it off :attr:`link`, the line through every size timed).
        cores: the cores the ranks get (at most the usable cores; fewer while other programs take some).
        fitted_batches: the per-rank batch sizes whose 1- and 2-rank steps the fit used.
    """

    fixed_s: float
    per_sample_s: float
    link: cost_model.AlphaBeta
    gradient_bytes: int
    cores: float
    allreduce_alone_s: dict[int, float]
    fitted_batches: tuple[int, ...] = ()

    def share(self, world_size: int) -> float:
        """How many times longer CPU work takes when ``world_size`` ranks share the cores: ``max(1, n / c)``."""
        return max(1.0, world_size / self.cores)

    def compute_s(self, batch_size: int) -> float:
        """Forward, backward and update of one rank alone: ``fixed_s + per_sample_s * batch_size``."""
        return self.fixed_s + self.per_sample_s * batch_size

    def ring_s(self, world_size: int, nbytes: int) -> float:
        """The α-β ring from 2 ranks, extrapolated to ``world_size`` ranks sharing the cores:
        ``(2(n-1)α + 2(n-1)/n·N·β) * share(n)`` (0 on 1 rank)."""
        return float(cost_model.predict("ring", nbytes, world_size, self.link)) * self.share(world_size)

    def allreduce_s(self, world_size: int) -> float:
        """The gradients' allreduce on ``world_size`` ranks: 0 on 1 rank, the α-β line on 2, as timed alone on more.

        Raises:
            ValueError: it was not timed on ``world_size`` ranks.
        """
        if world_size == 1:
            return 0.0
        if world_size == 2:
            return self.ring_s(2, self.gradient_bytes)
        if world_size not in self.allreduce_alone_s:
            raise ValueError(f"no allreduce of the gradients was timed on {world_size} ranks (timed on "
                             f"{sorted(self.allreduce_alone_s)}); measure with allreduce_world_sizes including it.")
        return self.allreduce_alone_s[world_size]

    def predict(self, world_size: int, batch_size: int) -> float:
        """Seconds per DDP step of ``world_size`` ranks at per-rank batch ``batch_size`` (module docstring)."""
        return self.compute_s(batch_size) * self.share(world_size) + self.allreduce_s(world_size)


@dataclass(frozen=True)
class Measurements:
    """Seconds per repeat, from :func:`measure`.

    Attributes:
        steps: ``{(ranks, per-rank batch): [seconds per DDP step, ...]}``.
        allreduce: ``{(ranks, bytes): [seconds per dist.all_reduce, ...]}``.
        gradient_bytes: the bytes of DigitsCNN's gradients (one allreduce per step).
    """

    steps: dict[tuple[int, int], list[float]]
    allreduce: dict[tuple[int, int], list[float]]
    gradient_bytes: int


def fit(steps: dict[tuple[int, int], Estimate], allreduce: dict[tuple[int, int], Estimate], gradient_bytes: int,
        cores: int, batch_sizes: tuple[int, ...] | None = None) -> Calibration:
    """Fit :class:`Calibration` from the medians of 1-rank steps at two or more batch sizes (``batch_sizes``;
    default all measured), of 2-rank steps at those batch sizes (without them the ranks are taken to get all
    ``cores``) and of the allreduces: on 2 ranks the α-β line through every size, at N (steadier than the one
    size N alone), on more ranks the gradients' allreduce as timed alone. Every other step is held out.

    Args:
        cores: the usable cores (:func:`course.timing.usable_cores`), the most the ranks can get.

    Raises:
        ValueError: fewer than two 1-rank batch sizes or two 2-rank allreduce sizes, or ``cores`` below 1.
    """
    ones = sorted((b, t.median) for (n, b), t in steps.items()
                  if n == 1 and (batch_sizes is None or b in batch_sizes))
    twos = sorted((size, t.median) for (n, size), t in allreduce.items() if n == 2)
    if len(ones) < 2 or len(twos) < 2:
        raise ValueError("need 1-rank steps at >= 2 batch sizes and 2-rank allreduces at >= 2 sizes; got steps "
                         f"{sorted(steps)} and allreduces {sorted(allreduce)}. Measure with calibration.measure.")
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}.")
    per_sample, fixed = np.polyfit([b for b, _ in ones], [t for _, t in ones], 1)
    fitted = tuple(b for b, _ in ones)
    shared = cost_model.fit_allreduce("ring", 2, [s for s, _ in twos], [t for _, t in twos])  # as 2 ranks got it
    alone = {n: t.median for (n, size), t in allreduce.items() if size == gradient_bytes and n > 2}
    two = float(cost_model.predict("ring", gradient_bytes, 2, shared))  # the line through every size, at N
    got = _cores_got(steps, fitted, fixed, per_sample, two, cores)
    share = max(1.0, 2 / got)
    link = cost_model.AlphaBeta(shared.alpha_s / share, shared.beta_s_per_byte / share)  # with a core per rank
    return Calibration(float(fixed), float(per_sample), link, gradient_bytes, got, alone, fitted)


def _cores_got(steps: dict[tuple[int, int], Estimate], batches: tuple[int, ...], fixed: float, per_sample: float,
               allreduce_2_s: float, cores: int) -> float:
    """``2 / share(2)``, between 1 and ``cores`` (``cores`` if share(2) <= 1): the 2-rank steps are
    ``compute(B) * share(2) + allreduce(2)`` (the allreduce as the 2 ranks got it), so share(2) is their
    least-squares ratio to compute(B)."""
    pairs = [(fixed + per_sample * b, steps[2, b].median - allreduce_2_s) for b in batches if (2, b) in steps]
    if not pairs:
        return float(cores)
    compute, rest = np.array(pairs).T
    share = float(compute @ rest / (compute @ compute))
    if share <= 1 + 1e-9:  # 2 ranks ran as fast as one: they had 2 cores or more, and only `cores` says how many
        return float(cores)
    return float(min(cores, max(1.0, 2 / share)))


@dataclass(frozen=True)
class Prediction:
    """One held-out configuration: predicted seconds beside the measured median and its interval."""

    world_size: int
    batch_size: int
    predicted_s: float
    measured: Estimate

    @property
    def error(self) -> float:
        """predicted / measured median - 1 (+0.10: the model is 10% too slow)."""
        return self.predicted_s / self.measured.median - 1

    def __str__(self) -> str:
        inside = "inside" if self.predicted_s in self.measured else "outside"
        return (f"{self.world_size} rank(s), batch {self.batch_size:>3}/rank: predicted "
                f"{self.predicted_s * 1e3:6.1f} ms, measured {self.measured.format_ms()}: error {self.error:+.0%} "
                f"({inside} the interval)")


def held_out(calibration: Calibration, steps: dict[tuple[int, int], Estimate]) -> list[Prediction]:
    """Predictions for every step configuration the fit did not use (more than 2 ranks, or a batch size it did
    not fit), sorted by ranks then batch."""
    return [Prediction(n, b, calibration.predict(n, b), t) for (n, b), t in sorted(steps.items())
            if n > 2 or b not in calibration.fitted_batches]


def held_out_allreduce(calibration: Calibration, allreduce: dict[tuple[int, int], Estimate]) -> list[Prediction]:
    """The α-β ring from 2 ranks (:meth:`Calibration.ring_s`) beside every allreduce timed on more than 2 ranks:
    how far the extrapolation misses (module docstring). ``Prediction.batch_size`` holds the bytes here."""
    return [Prediction(n, size, calibration.ring_s(n, size), t) for (n, size), t in sorted(allreduce.items()) if n > 2]


def worst_error(predictions: list[Prediction]) -> float:
    """The largest ``|error|`` of ``predictions``."""
    if not predictions:
        raise ValueError("no held-out predictions: measure at least one configuration with more than 1 rank.")
    return max(abs(p.error) for p in predictions)


def verdict(predictions: list[Prediction], target: float = 0.2) -> str:
    """One sentence on held-out ``predictions``: within ``target``; or outside it but inside the measurement's own
    95% interval (too noisy to tell); or outside both, which way, and what that way suggests."""
    worst = max(predictions, key=lambda p: abs(p.error))
    ranks = f"{worst.world_size} rank{'s' if worst.world_size > 1 else ''}"
    text = f"largest held-out error {worst.error:+.0%} ({ranks}, batch {worst.batch_size}/rank)"
    if abs(worst.error) <= target:
        return f"{text}: within the {target:.0%} we aim for."
    if worst.predicted_s in worst.measured:
        way = ("yet inside that step's own 95% interval: its timings spread too widely in this run to tell "
               "(2 shared cores)")
    elif worst.error < 0:
        way = "measured slower than predicted: did load from elsewhere grow while the many-rank steps ran?"
    else:
        way = "measured faster than predicted: did load from elsewhere slow the 1- and 2-rank runs the fit rests on?"
    return f"{text}: outside the {target:.0%} we aim for, {way} (benchmarks/calibration.py prints the spread)."


def summarize_all(measured: Measurements) -> tuple[dict[tuple[int, int], Estimate], dict[tuple[int, int], Estimate]]:
    """``(steps, allreduce)``: the median and 95% interval of every configuration of ``measured``."""
    return ({k: summarize(v) for k, v in measured.steps.items()},
            {k: summarize(v) for k, v in measured.allreduce.items()})


# --- measuring, on every rank (run with course.runtime.launch.launch) -------------------------------------------


def measure(world_sizes: tuple[int, ...] = (1, 2, 4), batch_sizes: tuple[int, ...] = (16, 64),
            allreduce_world_sizes: tuple[int, ...] = (2, 4), rounds: int = 5, steps_per_round: int = 2,
            allreduces_per_round: int = 4) -> Measurements | None:
    """Rank function: time DDP steps on the first n ranks for each (n, batch), and ``dist.all_reduce`` on the
    first n ranks at sizes around the gradients' (N/8, N/2, N, 2N), all in turns.

    Launch it on ``max(world_sizes)`` ranks: the first n ranks form a subgroup and train DigitsCNN with DDP
    (weak scaling: the per-rank batch is fixed) while the others wait at a barrier. Every round gives every step
    configuration ``steps_per_round`` steps and every allreduce ``allreduces_per_round`` calls, so a burst of
    load from elsewhere falls on several of them rather than on whichever ran then; round 0 warms everything up
    and is not kept.

    Returns:
        :class:`Measurements` (``rounds x steps_per_round`` repeats of each step, ``rounds x
        allreduces_per_round`` of each allreduce) on rank 0; None on the other ranks.
    """
    me = world.current()
    needed = max((*world_sizes, *allreduce_world_sizes))
    if needed > me.world_size:
        raise ValueError(f"launch on at least {needed} ranks to measure {needed} ranks; got {me.world_size}.")
    images, labels = data.load().train.tensors
    batches = {b: (images[:b].to(me.device), labels[:b].to(me.device)) for b in batch_sizes}
    sizes = sorted({*world_sizes, *allreduce_world_sizes})
    groups = {n: dist.new_group(list(range(n))) for n in sizes}  # every rank must call new_group
    trainers = {n: _trainer(groups[n]) for n in world_sizes if me.rank < n}
    nbytes = models.gradient_bytes(models.DigitsCNN())
    tensors = {size: torch.ones(size // 4, device=me.device) for size in (nbytes // 8, nbytes // 2, nbytes, 2 * nbytes)}
    steps: dict[tuple[int, int], list[float]] = {(n, b): [] for n in world_sizes for b in batch_sizes}
    reduces: dict[tuple[int, int], list[float]] = {(n, 4 * t.numel()): [] for n in allreduce_world_sizes
                                                   for t in tensors.values()}
    for round_ in range(rounds + 1):  # round 0 warms every configuration up, untimed
        for n in world_sizes:
            for b in batch_sizes:
                if me.rank < n:
                    times = _time_steps(*trainers[n], *batches[b], steps_per_round + 1)[1:]  # first: caches cold
                    steps[n, b] += times if round_ else []
                dist.barrier()
        for n in allreduce_world_sizes:
            for tensor in tensors.values():
                times = _time_allreduces(tensor, groups[n], me.rank < n, allreduces_per_round)
                reduces[n, 4 * tensor.numel()] += times if round_ else []
    return Measurements(steps, reduces, nbytes) if me.is_main else None


def _trainer(group: dist.ProcessGroup) -> tuple[nn.Module, torch.optim.Optimizer]:
    me = world.current()
    torch.manual_seed(0)
    device_ids = [me.device.index] if me.device.type == "cuda" else None
    model = DistributedDataParallel(models.DigitsCNN().to(me.device), device_ids=device_ids, process_group=group)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _time_steps(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
                steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        if images.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def _time_allreduces(tensor: torch.Tensor, group: dist.ProcessGroup, member: bool, calls: int) -> list[float]:
    """Seconds of each of ``calls`` back-to-back ``dist.all_reduce`` on ``group`` after one untimed call, as a
    training step's allreduce runs on ranks already awake ([] off the group)."""
    tensor.fill_(1.0)  # fresh values: repeated sums would grow without bound
    dist.barrier()
    if not member:
        return []
    times = []
    for _ in range(calls + 1):
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if tensor.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]
