"""Lab "ddp": the student writes DistributedDataParallel by hand, and the ranks check it against torch's.

The student's ``MyDDP(module, bucket_cap_bytes)`` (stub: ``grader/labs/ddp/stub.py``, taught in
``notebooks/04b_distributed_optimizer.ipynb``) broadcasts rank 0's parameters, registers a
``register_post_accumulate_grad_hook`` per parameter, fills buckets of at most ``bucket_cap_bytes`` in the order
gradients become ready, launches each bucket's allreduce (``async_op=True``) from the hook that fills it, and
in ``finish_gradient_synchronization()`` waits for them all and averages. :func:`check_on_rank` runs on every
rank and measures, with :mod:`course.runtime.recorder` installed:

* ``broadcast``: ranks seeded differently hold rank 0's parameters once ``MyDDP`` is built;
* ``matches_ddp``: after each of ``steps`` SGD steps on the same data, the parameters equal those of torch's
  ``DistributedDataParallel`` (built before the recorder, with its default C++ allreduce: no comm hook) within
  a bound derived from the allreduce's rounding (:mod:`.gradients`); a miss names the first averaged gradient
  that diverged (parameter, step, rank), and is diagnosed from the measured ratio of the two updates;
* ``one_allreduce_per_bucket``: each step makes as many ``all_reduce`` calls as there are buckets
  (``course.ddp.buckets.assign_buckets`` over the gradients' sizes in the order their hooks fired);
* ``in_order``: the buckets were launched in order, bucket 0 first (the same order on every rank): each step's
  allreduce sizes are the planned buckets' (reverse ``module.parameters()`` order) in order, or those of
  buckets filled in the order gradients became ready; the model registers its second and third layers in
  swapped order, so a bucket fills before an earlier one;
* ``overlap``: some allreduce was launched before backward's last gradient was ready, and was still not waited
  for when backward produced a later gradient: timestamps of our own hooks (registered first, so they fire
  before the student's) against the launch and ``wait()`` times of every call;
* ``no_torch_ddp``: ``torch.nn.parallel.DistributedDataParallel`` was never constructed;
* ``modelled_speed``: the last step's schedule timed by the performance model on real clusters beside torch DDP's
  defaults (:mod:`course.perf.schedule`); informational unless :data:`SPEED` gives it points.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import world
from course.ddp import buckets
from course.numerics.bounds import verdict
from course.perf import protocol
from course.perf import schedule as modelled
from course.runtime.observed_record import Record
from course.runtime.recorder import ORIGINAL, Recorder, recording
from grader.labs.agree import spreads
from grader.labs.core import Check, Finding, Lab, load_entry
from grader.labs.ddp import gradients
from grader.labs.divergence import named
from grader.labs.late_results import results_at_wait

ENTRY = "MyDDP"

CHECKS = (
    Check("broadcast", "every rank starts from rank 0's parameters", 2),
    Check("matches_ddp", "parameters equal torch's DistributedDataParallel's after every step, within rounding", 4),
    Check("one_allreduce_per_bucket", "one allreduce per bucket of at most bucket_cap_bytes", 2),
    Check("in_order", "buckets launched in order, bucket 0 first, as every rank must", 2),
    Check("overlap", "an allreduce runs while backward is still computing gradients", 3),
    Check("no_torch_ddp", "torch's DistributedDataParallel is not used", 1),
)

#: The modelled speed of the student's bucket schedule (course.perf.schedule): reported, never scored, unless an
#: instructor sets points here, e.g. SpeedGrading(points=2, within=1.5) for a modelled step within 1.5x DDP's.
SPEED = modelled.SpeedGrading()
CHECKS += (Check("modelled_speed", f"modelled step time on {SPEED.cluster} within {SPEED.within:g}x torch DDP's"
                 + ("" if SPEED.points else " (informational)"), SPEED.points, shows_measure=True),)

LR, BATCH_SIZE = 0.1, 8


class _Net(nn.Module):
    """64 -> 21 -> 32 -> 32 -> 10 with ReLUs, its second and third layers registered in swapped order.

    The reverse of ``parameters()`` (how buckets are planned) is last, second, third, first layer; backward makes
    gradients last, third, second, first. With buckets of 4224 bytes, bucket 1 (the third layer's 4224 bytes)
    fills before bucket 0 (the last and second layers'): a solution that launches whatever is full goes out of order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.first, self.third, self.second, self.last = (nn.Linear(64, 21), nn.Linear(32, 32), nn.Linear(21, 32),
                                                          nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x.flatten(1)))
        return self.last(torch.relu(self.third(torch.relu(self.second(x)))))


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return _Net()


def _batch(step: int, seed: int, me: world.Rank) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``BATCH_SIZE`` samples of global batch ``step`` (the same for the student and for DDP)."""
    generator = torch.Generator().manual_seed(10_000 * seed + step)
    images = torch.randn(me.world_size * BATCH_SIZE, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (me.world_size * BATCH_SIZE,), generator=generator)
    rows = slice(me.rank * BATCH_SIZE, (me.rank + 1) * BATCH_SIZE)
    return images[rows].to(me.device), labels[rows].to(me.device)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def reference_trajectory(config: dict, me: world.Rank) -> list[torch.Tensor]:
    """Parameters of torch's DDP before and after each of ``config["steps"]`` SGD steps (flattened, on the CPU)."""
    model = _model(config["seed"]).to(me.device)
    ddp = DistributedDataParallel(model, device_ids=[me.device.index] if me.device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    trajectory = [_flat(model)]
    for step in range(config["steps"]):
        images, labels = _batch(step, config["seed"], me)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(images), labels).backward()
        optimizer.step()
        trajectory.append(_flat(model))
    world.settle()  # before the DDP object goes: its last allreduce's worker may still hold a Python object
    return trajectory


@dataclass
class StepRecord:
    """What one of the student's training steps did, on this rank's clock (``time.perf_counter()``)."""

    calls: list[Record]
    ready: list[float] = field(default_factory=list)  # when each gradient became ready, in order
    sizes: list[int] = field(default_factory=list)  # its bytes, same order
    backward_end: float = 0.0
    planned: list[int] = field(default_factory=list)  # gradient bytes in reverse parameters() order
    sync: str = ""  # what .grad held after finish_gradient_synchronization: "", "no_wait", "no_copy", "early_read"
    local: dict[str, torch.Tensor] = field(default_factory=dict)  # this rank's own gradients, by parameter name
    synced: dict[str, torch.Tensor] = field(default_factory=dict)  # .grad after finish_gradient_synchronization


def _train_student(my_ddp: type, config: dict, recorder: Recorder, me: world.Rank
                   ) -> tuple[list[torch.Tensor], list[StepRecord]]:
    """Train with the student's class exactly as the reference trained with DDP; record each step."""
    model = _model(config["seed"]).to(me.device)
    clock: list[tuple[float, int]] = []
    local: dict[nn.Parameter, torch.Tensor] = {}  # this rank's own gradients, before any synchronization

    def ready(p: nn.Parameter) -> None:
        clock.append((time.perf_counter(), p.nbytes))
        local[p] = p.grad.detach().clone()

    for p in model.parameters():  # registered before the student's hooks, so ours fire first
        p.register_post_accumulate_grad_hook(ready)
    wrapped = my_ddp(model, config["bucket_cap_bytes"])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    trajectory, records = [_flat(model)], []
    for step in range(config["steps"]):
        images, labels = _batch(step, config["seed"], me)
        optimizer.zero_grad()
        recorder.clear()
        clock.clear()
        loss = nn.functional.cross_entropy(wrapped(images), labels)
        loss.backward()
        backward_end = time.perf_counter()
        wrapped.finish_gradient_synchronization()
        sync = _synchronized(recorder.calls, local, me.world_size)
        own = {name: local[p] for name, p in list(model.named_parameters())[::-1] if p in local}
        synced = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        planned = [p.nbytes for p in model.parameters() if p.requires_grad][::-1]
        records.append(StepRecord(list(recorder.calls), [t for t, _ in clock], [n for _, n in clock], backward_end,
                                  planned, sync, own, synced))
        trajectory.append(_flat(model))
    return trajectory, records


def _synchronized(calls: list[Record], local: dict[nn.Parameter, torch.Tensor], world_size: int) -> str:
    """What went wrong between the allreduces and ``.grad``, if every gradient shows it ("" otherwise).

    "no_wait": some allreduce was never waited for; "no_copy": every ``.grad`` still holds this rank's own
    gradient; "early_read": every ``.grad`` is this rank's own gradient / world_size (the bucket was read before its
    allreduce's result landed, which :func:`grader.labs.late_results.results_at_wait` makes happen every time)."""
    if any(call.op == "all_reduce" and call.async_op and call.waited is None for call in calls):
        return "no_wait"
    if local and all(p.grad is not None and torch.equal(p.grad, g) for p, g in local.items()):
        return "no_copy"
    if local and all(p.grad is not None and torch.allclose(p.grad, g / world_size) for p, g in local.items()):
        return "early_read"
    return ""


def _broadcast_spread(my_ddp: type, config: dict, me: world.Rank) -> tuple[float, float]:
    """Build the student's class on ranks seeded differently: (max |rank 0 - this rank|, how far rank 0 moved)."""
    model = _model(config["seed"] + 1 + me.rank).to(me.device)
    before = _flat(model)
    my_ddp(model, config["bucket_cap_bytes"])
    after = _flat(model)
    root = after.clone().to(me.device)
    ORIGINAL["broadcast"](root, src=0)
    moved = torch.zeros(1, device=me.device)
    if me.rank == 0:
        moved += (after - before).abs().max().item()
    ORIGINAL["broadcast"](moved, src=0)
    return (after - root.cpu()).abs().max().item(), moved.item()


# -- verdicts (pure functions of what was measured) ---------------------------------------------------------------
def judge_broadcast(spread: float, moved: float, rank: int) -> Finding:
    """Finding for ``broadcast``: ``spread`` = max |this rank - rank 0| once MyDDP was built from different seeds."""
    if moved > 0:
        return Finding("broadcast", False, f"rank 0's parameters changed by {moved:.2g} when {ENTRY} was built: "
                       "every rank must take rank 0's parameters as they are (broadcast from rank 0, not an average)")
    if spread > 0:
        return Finding("broadcast", False, f"rank {rank}'s parameters differ from rank 0's by {spread:.2g} right after "
                       f"{ENTRY}(...) was built on ranks seeded differently: broadcast rank 0's parameters into the "
                       "module at the start (torch.distributed.broadcast(p.data, src=0) for every parameter)")
    return Finding("broadcast", True, "ranks seeded differently all hold rank 0's parameters once MyDDP is built")


def _diagnosis(update_ratio: float, world_size: int) -> str:
    """What an update ``update_ratio`` times DDP's says about the student's gradients."""
    if abs(update_ratio - world_size) < 0.05 * world_size:
        return "the gradients were summed, not averaged: divide the allreduced buckets by world_size"
    if abs(update_ratio - 1 / world_size) < 0.05 / world_size:
        return "the gradients were divided by world_size twice"
    if abs(update_ratio) < 0.05:
        return "the step barely moved the parameters: write the averaged bucket back into each parameter's .grad"
    return "check which gradients each bucket carries and that each is copied back to its own parameter's .grad"


#: what ``StepRecord.sync`` says went wrong, in the learner's terms
SYNC_MISTAKES = {
    "no_wait": ("an allreduce was never waited for, and its result is not there until work.wait() returns: call "
                "wait() on every work handle in finish_gradient_synchronization, then read the bucket"),
    "no_copy": ("every .grad still holds this rank's own gradient: the averaged bucket was never copied back into "
                "the parameters' .grad"),
    "early_read": ("every .grad is this rank's own gradient divided by world_size: the bucket was read before its "
                   "allreduce finished; call wait() first, then divide and copy back"),
}


def judge_matches(ours: list[torch.Tensor], reference: list[torch.Tensor], spreads: list[float], rank: int,
                  world_size: int, sync: list[str] | None = None, limits: list[torch.Tensor] | None = None
                  ) -> Finding:
    """Finding for ``matches_ddp``: ``ours``/``reference`` flat parameters before and after each step, ``spreads``
    the largest |rank r - rank 0| difference of ours over all ranks r after each step, ``sync`` each step's
    ``StepRecord.sync``, ``limits`` how far each entry may be from DDP's by rounding (None: not at all)."""
    for step in range(len(reference)):
        limit = limits[step] if limits is not None else torch.zeros_like(reference[step], dtype=torch.float64)
        judged = verdict(ours[step], reference[step], limit)
        if judged.within:
            continue
        gap = (ours[step] - reference[step]).abs().max().item()
        if step == 0:
            return Finding("matches_ddp", False, f"rank {rank}'s parameters changed by {gap:.2g} when {ENTRY} was "
                           "built, on ranks that all start equal: building it must not change them")
        start = (f"after step {step} rank {rank}'s parameters differ from DDP's by {gap:.2g} (rounding allows "
                 f"{judged.bound:.2g} there)")
        if sync and sync[step - 1] in SYNC_MISTAKES:
            return Finding("matches_ddp", False, f"{start}: {SYNC_MISTAKES[sync[step - 1]]}")
        if spreads[step] > float(limit.max()):
            return Finding("matches_ddp", False, f"{start}, and the ranks no longer agree (they differ by up to "
                           f"{spreads[step]:.2g}): every rank must apply the same allreduced gradients")
        ours_update, ddp_update = ours[step] - ours[step - 1], reference[step] - reference[step - 1]
        ratio = (ours_update @ ddp_update / (ddp_update @ ddp_update)).item()
        return Finding("matches_ddp", False, f"{start}: your update is {ratio:.2f}x DDP's; "
                       f"{_diagnosis(ratio, world_size)}")
    return Finding("matches_ddp", True, f"parameters equal DDP's after each of {len(reference) - 1} steps, "
                   "within rounding")


def judge_buckets(records: list[StepRecord], bucket_cap_bytes: int) -> Finding:
    """Finding for ``one_allreduce_per_bucket``: each step's all_reduce calls against the buckets it needed."""
    for step, record in enumerate(records, start=1):
        made = len([call for call in record.calls if call.op == "all_reduce"])
        needed = len(buckets.assign_buckets(record.sizes, bucket_cap_bytes))
        if made == needed or record.planned and made == len(buckets.assign_buckets(record.planned, bucket_cap_bytes)):
            continue  # buckets filled in the order gradients became ready, or planned in reverse parameters() order
        why = {0: ": no allreduce at all", 1: ": everything in one allreduce, whatever bucket_cap_bytes says",
               len(record.sizes): ": one per gradient, not one per bucket"}.get(made, "")
        return Finding("one_allreduce_per_bucket", False, f"step {step} made {made} allreduces for {needed} buckets "
                       f"of at most {bucket_cap_bytes} bytes{why} (a bucket is closed before the gradient that would "
                       "overflow it; a gradient bigger than a bucket gets one of its own)")
    return Finding("one_allreduce_per_bucket", True, f"one allreduce per bucket in each of {len(records)} steps")


def _bucket_bytes(sizes: list[int], bucket_cap_bytes: int) -> list[int]:
    """The bytes of each bucket when ``sizes`` are packed in order into buckets of at most ``bucket_cap_bytes``."""
    return [sum(sizes[i] for i in bucket) for bucket in buckets.assign_buckets(sizes, bucket_cap_bytes)]


def judge_in_order(records: list[StepRecord], bucket_cap_bytes: int) -> Finding:
    """Finding for ``in_order``: each step's allreduces carry the planned buckets in order (bucket 0 first).

    Buckets filled in the order gradients became ready are in order by construction, and pass too. Allreduces that
    are not a reordering of the planned buckets are the bucket check's to judge, not this one's."""
    for step, record in enumerate(records, start=1):
        sizes = [call.nbytes for call in record.calls if call.op == "all_reduce"]
        planned = _bucket_bytes(record.planned, bucket_cap_bytes)
        if sizes in (planned, _bucket_bytes(record.sizes, bucket_cap_bytes)) or sorted(sizes) != sorted(planned):
            continue
        order = [planned.index(size) for size in sizes]
        return Finding("in_order", False, f"step {step} launched the buckets in the order {', '.join(map(str, order))}"
                       f" (bytes {', '.join(map(str, sizes))}): bucket {order[0]} filled first and went first. Every "
                       "rank must launch bucket 0, then 1, 2, ...: collectives are matched by order, and on GPUs "
                       "ranks can see gradients in different orders. Launch a full bucket only once every earlier "
                       "bucket is launched")
    return Finding("in_order", True, f"buckets launched in order in each of {len(records)} steps")


def _overlapped(call: Record, ready: list[float]) -> bool:
    """Launched before the last gradient was ready, and not waited for until a later gradient was."""
    later = [t for t in ready if t > call.start]
    return bool(later) and (call.waited is None or call.waited > later[0])


def judge_overlap(records: list[StepRecord]) -> Finding:
    """Finding for ``overlap``: in every step, some allreduce still ran while backward computed a gradient."""
    for step, record in enumerate(records, start=1):
        calls = [call for call in record.calls if call.op == "all_reduce"]
        if any(_overlapped(call, record.ready) for call in calls):
            continue
        if not calls:
            why = "no allreduce was made, so nothing could overlap backward"
        elif all(call.start >= record.backward_end for call in calls):
            late = 1e3 * (min(call.start for call in calls) - record.backward_end)
            why = (f"every allreduce started after backward ended (the first {late:.2g} ms after it): nothing "
                   "overlapped; launch a bucket's allreduce (async_op=True) from the hook that fills it")
        elif not any(call.start < record.ready[-1] for call in calls):
            why = ("every allreduce started once backward's last gradient was ready: nothing overlapped; launch each "
                   "bucket's allreduce as soon as that bucket is full")
        elif not all(call.async_op for call in calls):
            why = ("you called all_reduce without async_op=True inside the hook: it returns only when done, so "
                   "backward waited for every allreduce and nothing overlapped")
        else:
            why = ("you waited for each allreduce inside the hook: backward could not compute the next gradient until "
                   "it finished, so nothing overlapped; keep the work handles and wait for them in "
                   "finish_gradient_synchronization")
        return Finding("overlap", False, f"step {step}: {why}")
    return Finding("overlap", True, f"in each of {len(records)} steps an allreduce ran while backward computed "
                   "later gradients")


def judge_speed(record: StepRecord) -> Finding:
    """Finding for ``modelled_speed``: the step's schedule timed by the performance model on each named cluster,
    beside torch DDP's defaults on the same gradients (:func:`course.perf.schedule.compare`)."""
    calls = [call for call in record.calls if call.op == "all_reduce"]
    if not calls:
        return Finding("modelled_speed", not SPEED.points, "no allreduce was recorded: no schedule to time")
    plan = modelled.from_record(record.sizes, record.ready, [c.start for c in calls], [c.waited for c in calls],
                                [c.nbytes for c in calls], record.backward_end)
    comparisons = {cluster: modelled.compare(plan, cluster, BATCH_SIZE) for cluster in modelled.CLUSTERS}
    passed = SPEED.judge(comparisons[SPEED.cluster]) or not SPEED.points
    typical = protocol.typical_error()  # the median error on published runs no constant was fitted to
    return Finding("modelled_speed", passed, f"MODELLED step time (modelled, typically within {typical:.0%}), your "
                   "bucket schedule beside torch DDP's defaults: " + "; ".join(str(c) for c in comparisons.values()))


def judge_no_torch_ddp(constructed: list[str]) -> Finding:
    if "DistributedDataParallel" in constructed:
        return Finding("no_torch_ddp", False, "you built torch's DistributedDataParallel: this lab asks you to write "
                       "what it does (broadcast, hooks, buckets, allreduce) yourself")
    return Finding("no_torch_ddp", True, "torch's DistributedDataParallel was not used")


# -- on every rank ----------------------------------------------------------------------------------------------
def check_on_rank(path: str, config: dict) -> list[Finding]:
    """Run the student's ``MyDDP`` from ``path`` on this rank as ``config`` says; one Finding per check.

    An exception from the student's code propagates: the driver (``grader.labs.core``) explains it.
    """
    me = world.current()
    reference = reference_trajectory(config, me)
    with recording(me.world_size, forbidden=(DistributedDataParallel,)) as recorder, results_at_wait():
        my_ddp = load_entry(path, ENTRY)
        spread, moved = _broadcast_spread(my_ddp, config, me)
        trajectory, records = _train_student(my_ddp, config, recorder, me)
    world.settle()  # the student's models (a torch DDP among them, maybe) go when this returns
    divergence, limits = gradients.judge([r.local for r in records], [r.synced for r in records], me.rank,
                                         me.world_size, me.device)
    order = [name for name, _ in _model(config["seed"]).named_parameters()]
    bounds = gradients.trajectory_bounds(limits, trajectory, LR, order)
    return named([judge_broadcast(spread, moved, me.rank),
                  judge_matches(trajectory, reference, spreads(trajectory, me.device), me.rank, me.world_size,
                                [record.sync for record in records], bounds),
                  judge_buckets(records, config["bucket_cap_bytes"]),
                  judge_in_order(records, config["bucket_cap_bytes"]), judge_overlap(records),
                  judge_no_torch_ddp(recorder.constructed), judge_speed(records[-1])], divergence)


LAB = Lab(
    name="ddp", title="DDP by hand: broadcast, hooks, buckets, overlapped allreduce",
    notebook="04b_distributed_optimizer", student_file="labs/ddp_by_hand.py", entry=ENTRY, checks=CHECKS,
    rank_check=check_on_rank,
    runs=({"world_size": 4, "seed": 0, "steps": 3, "bucket_cap_bytes": 4224, "timeout_s": 120,
           "label": "{steps} SGD steps of a 4-layer MLP, buckets of at most {bucket_cap_bytes} bytes"},),
    # each student's own world size and bucket cap (grader.labs.variant); every cap here still fills a later
    # bucket before an earlier one, whichever of a layer's two gradients is ready first
    variant={"world_size": (4, 3), "bucket_cap_bytes": (4224, 2048, 3000, 4200)},
    uneven={"world_size": 3, "assumes": "4 ranks"},  # the self-check also runs this (grader.labs.core.Lab.uneven)
    hidden_runs=({"world_size": 2, "seed": "jitter", "steps": 3, "bucket_cap_bytes": 4224, "timeout_s": 120,
                  "label": "3 SGD steps, buckets of at most 4224 bytes"},
                 {"world_size": 3, "seed": "jitter", "steps": 4, "bucket_cap_bytes": 9000, "timeout_s": 120,
                  "label": "4 SGD steps, buckets of at most 9000 bytes"}),
    shortcuts=("course.ddp.distributed_optimizer:DistributedOptimizer",),
    hang_hint=("A hang in this lab usually means the ranks launched different allreduces (buckets planned in "
               "different orders) or one rank never launched a bucket."),
)
