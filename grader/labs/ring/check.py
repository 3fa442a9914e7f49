"""Lab (notebook 04): the student writes ``ring_allreduce(tensor, op)`` from point-to-point messages only.

On every rank :func:`check_on_rank` loads the student's file under a :class:`~course.runtime.comm_log.CommLog`,
calls ``ring_allreduce`` on each case of the run (a length, a dtype, an op) and records, per case: the result
(returned to the driver), ``dist.all_reduce``'s result (torch's own function), the collectives called, the
bytes and messages sent. Outside the ranks :func:`cross_check` regenerates every rank's input from the run's
seed, computes the exact answer and explains the first wrong chunk (:mod:`grader.labs.ring_diagnosis`), led by
the first wrong message: each rank keeps a copy of what it sent (:func:`course.runtime.observed.keeping_sent`),
read step by step by :mod:`course.collectives.ring_record` (which also draws them, in notebook 04).

Checks: equal to ``dist.all_reduce`` on every rank (within the rounding ``ring_diagnosis.allowed`` derives); only
point-to-point calls; each rank sends 2(n-1)/n of the tensor (within one element per chunk, for uneven chunks);
2(n-1) messages per rank (one per step; checked where every chunk is non-empty).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from course import world
from course.collectives import ring_record
from course.collectives.ring_record import Sent
from course.runtime import observed
from course.runtime.comm_log import POINT_TO_POINT, SENDS, Call, CommLog, collectives, sends
from grader.labs.core import Check, Finding, Lab, RankFindings, StudentError, load_entry
from grader.labs.message_sizes import SizeMismatch, matched_sizes
from grader.labs.ring.diagnosis import allowed, close, expected, first_wrong

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
CHECKS = (
    Check("matches", "equal to dist.all_reduce on every rank (sum and avg; float32, float64, bfloat16)", 4),
    Check("point_to_point_only", "only point-to-point calls (send/recv or isend/irecv), no collective", 2),
    Check("bytes", "each rank sends 2(n-1)/n of the tensor", 2),
    Check("steps", "2(n-1) steps: one message per step, n-1 reduce-scatter and n-1 all-gather", 2),
    Check("neighbours", "every message goes to one neighbour and comes from the other (either way round)", 2),
)


def inputs(seed: int, world_size: int, numel: int, dtype: str) -> torch.Tensor:
    """Every rank's input, (world_size, numel) float64: nonzero integers in [-8, 8], exact in every dtype."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + numel * 101 + world_size)
    magnitude = torch.randint(1, 9, (world_size, numel), generator=generator)
    sign = torch.randint(0, 2, (world_size, numel), generator=generator) * 2 - 1
    return (magnitude * sign).to(DTYPES[dtype]).double()


def describe(case: list) -> str:
    numel, dtype, op = case
    return f"{numel} {dtype} element{'s' if numel != 1 else ''}, op={op!r}"


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: run the student's ring on each case of ``config`` and record what it did."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), world.current().device
    with CommLog() as log:
        ring_allreduce = load_entry(path, "ring_allreduce")
        found: list[Finding] = []
        outputs, sent = [], []
        for case in config["cases"]:
            numel, dtype, op = case
            every = inputs(config["seed"], world_size, numel, dtype)
            tensor = every[rank].to(device, DTYPES[dtype])
            reference = tensor.clone()
            log.original("all_reduce")(reference)
            if op == "avg":
                reference /= world_size  # gloo has no ReduceOp.AVG
            mark = log.mark()
            mine = tensor.clone()
            try:
                with matched_sizes(f"{config['seed']}/{len(outputs)}"), _kept_sends(numel) as kept:
                    returned = ring_allreduce(mine, op=op)
            except SizeMismatch as mismatch:
                raise StudentError(f"{describe(case)}: {_mismatch(mismatch, world_size)}") from None
            calls = log.since(mark)
            limit = 2 * allowed(every, op, DTYPES[dtype])  # both this ring and torch's round
            found += _findings(describe(case), rank, world_size, mine, returned, reference, calls, numel, limit)
            outputs.append(mine.cpu())  # cross-checked outside the ranks, on the CPU
            sent.append([Sent(rank, k, r.peer, r.sent) for k, r in enumerate(kept) if r.sent is not None])
    return RankFindings(found, {"outputs": outputs, "sends": sent})


#: the longest case whose messages are kept for the first wrong chunk (each is copied: a few MB at most)
KEPT_ELEMENTS = 20_000


@contextlib.contextmanager
def _kept_sends(numel: int) -> Iterator[list]:
    """The send records of the ``with`` block, each with a copy of what it sent (none for a long case)."""
    kept: list = []
    if numel > KEPT_ELEMENTS:
        yield kept
        return
    with observed.keeping_sent(), observed.listening(lambda r: kept.append(r) if r.op == "send" else None):
        yield kept


def _findings(case: str, rank: int, world_size: int, mine: torch.Tensor, returned: object,
              reference: torch.Tensor, calls: list, numel: int, limit: torch.Tensor) -> list[Finding]:
    """This rank's findings for one case (messages start with the case); ``limit``: the difference from
    ``dist.all_reduce``'s result that rounding allows, element by element (:func:`diagnosis.allowed`, twice)."""
    found = []
    same = mine.shape == limit.shape and bool(close(mine.double().cpu(), reference.double().cpu(), limit).all())
    if returned is not mine and isinstance(returned, torch.Tensor) and not same:
        message = f"rank {rank}'s tensor was not changed in place (your function returned a new one): write into it"
    else:
        worst = (mine.double() - reference.double()).abs().max().item() if numel else 0.0
        message = f"rank {rank}'s result differs from dist.all_reduce's by up to {worst:g}"
    found.append(Finding("matches", same, "" if same else f"{case}: {message}"))
    used = collectives(calls)
    called = f"{case}: rank {rank} called dist.{', dist.'.join(used)} (a collective): the lab asks for the ring " \
             "from send/recv (or isend/irecv) only"
    found.append(Finding("point_to_point_only", not used, called if used else ""))
    sizes = [call.nbytes for call in calls if call.name in SENDS]
    found.append(_bytes_finding(case, rank, world_size, mine.element_size(), numel, sizes))
    if numel >= world_size:  # with empty chunks a ring may skip empty messages
        count, steps = sends(calls), 2 * (world_size - 1)
        found.append(Finding("steps", count == steps, "" if count == steps else
                             f"{case}: rank {rank} sent {count} messages (send/isend); a ring takes 2(n-1) = {steps} "
                             f"steps of one message each: n-1 = {world_size - 1} to reduce-scatter, n-1 to all-gather"))
    found.append(_neighbours_finding(case, rank, world_size, calls))
    return found


def _mismatch(mismatch: SizeMismatch, world_size: int) -> str:
    """A send and its receive of different sizes, said as the ring step where the chunk indices disagree."""
    step, phase = mismatch.index + 1, "reduce-scatter"
    if step > world_size - 1:
        step, phase = step - (world_size - 1), "all-gather"
    return (f"the chunk indices of sender and receiver disagree at step {step} of the {phase}: rank "
            f"{mismatch.sender} sends a chunk of {mismatch.sent} elements and rank {mismatch.receiver} receives it "
            f"into a chunk of {mismatch.expected}. The receiver must receive into the chunk index the sender sends "
            "(tensor_split's chunks differ in size when world_size does not divide the length)")


def _neighbours_finding(case: str, rank: int, world_size: int, calls: list[Call]) -> Finding:
    """Every send goes to one neighbour and every receive comes from the other: the ring's one hop per step.

    The ring may run either way round, consistently: the first message says which (sending to rank + 1 or
    receiving from rank - 1 is clockwise; sending to rank - 1 or receiving from rank + 1 the other way)."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    messages = [call for call in calls if call.name in POINT_TO_POINT]
    if messages and messages[0].peer == (left if messages[0].name in SENDS else right):
        right, left = left, right  # counter-clockwise: from here on "right" names where this rank sends
    for number, call in enumerate(messages, start=1):
        sending = call.name in SENDS
        if call.peer == (right if sending else left):
            continue
        verb, peer = ("sent", f"to rank {call.peer}") if sending else ("received", "from any rank (src=None)" if
                                                                        call.peer is None else f"from rank {call.peer}")
        way = "right" if right == (rank + 1) % world_size else "left"
        other = "left" if way == "right" else "right"
        return Finding("neighbours", False, f"{case}: rank {rank}'s message {number} was {verb} {peer}; in a ring "
                       f"rank {rank} sends only to its {way} neighbour, rank {right}, and receives only from its "
                       f"{other} one, rank {left}: pass each partial sum on one hop per step, never straight to its "
                       "owner (a ring may run either way round, the same way at every step)")
    return Finding("neighbours", True)


def _bytes_finding(case: str, rank: int, world_size: int, element_size: int, numel: int, sizes: list[int]
                   ) -> Finding:
    """Bytes sent (``sizes``: each message's) against 2(n-1)/n of the tensor, within one element per message."""
    steps, sent = 2 * (world_size - 1), sum(sizes)
    target = steps / world_size * numel * element_size
    if abs(sent - target) <= steps * element_size:
        return Finding("bytes", True)
    tensor_bytes = numel * element_size
    if sent == 0:
        why = "nothing went through send/isend, so the data moved some other way (a collective?)"
    elif whole := sum(size == tensor_bytes for size in sizes) if numel >= 2 * world_size else 0:
        why = f"{whole} of its {len(sizes)} messages carried the whole tensor instead of one chunk (1/n of it)"
    else:
        why = f"that is {sent / tensor_bytes:.2f} tensors; each of the 2(n-1) steps sends one chunk of about 1/n"
    return Finding("bytes", False, f"{case}: rank {rank} sent {sent:,} bytes; a ring sends 2(n-1)/n of the "
                   f"{tensor_bytes:,}-byte tensor = {target:,.0f} bytes: {why}")


def cross_check(config: dict, evidence: list[dict]) -> list[Finding]:
    """Outside the ranks: each case's outputs against the exact answer from inputs generated here."""
    for position, case in enumerate(config["cases"]):
        numel, dtype, op = case
        truth = inputs(config["seed"], config["world_size"], numel, dtype)
        wrong = first_wrong([e["outputs"][position] for e in evidence], truth, op, DTYPES[dtype])
        if wrong:
            return [Finding("matches", False, f"{describe(case)}: {_first_message(evidence, position, truth, op)}"
                                              f"{wrong}")]
    return [Finding("matches", True)]


def _first_message(evidence: list[dict], position: int, truth: torch.Tensor, op: str) -> str:
    """``"the first wrong message is step 4 (all-gather): rank 3 sent chunk 0 to rank 0. "``, or "" when every
    message held a right chunk (or none were kept)."""
    sends = [sent for e in evidence for sent in e.get("sends", [[]] * (position + 1))[position]]
    wrong = ring_record.first_wrong(ring_record.judge(sends, truth, op)) if sends else None
    return f"the first wrong message is {wrong.where()}. " if wrong else ""


def cases_4(long: int, longer: int) -> list[list]:
    """The cases of the 4-rank run: two lengths that 4 does not divide, then lengths below and near 4 ranks."""
    return [[long, "float32", "sum"], [long, "float64", "avg"], [longer, "bfloat16", "avg"], [64, "bfloat16", "sum"],
            [3, "float32", "sum"], [2, "float64", "avg"]]


CASES_4 = cases_4(1001, 4099)
CASES_3 = [[1000, "float32", "avg"], [7, "float64", "sum"], [301, "bfloat16", "sum"], [1, "float32", "avg"]]
LAB = Lab(
    name="ring",
    title="ring allreduce from point-to-point messages",
    notebook="04_allreduce",
    student_file="labs/ring_allreduce.py",
    entry="ring_allreduce",
    checks=CHECKS,
    rank_check=check_on_rank,
    cross_check=cross_check,
    # timeouts: starting the ranks is most of a run, and a loaded 2-core machine can take a minute for it
    runs=({"world_size": 4, "seed": 0, "cases": CASES_4, "timeout_s": 120},
          {"world_size": 3, "seed": 1, "cases": CASES_3, "timeout_s": 120}),
    # each student's 4-rank run has its own lengths (grader.labs.variant); the 3-rank run keeps the world sizes
    # spanned, so a ring written for one world size fails the self-check whatever the variant
    variant={"cases": tuple(cases_4(long, longer) for long, longer in (
        (1001, 4099), (37, 1001), (998, 4097), (1003, 2050), (517, 3001), (255, 4094)))},
    hidden_runs=tuple({"world_size": n, "seed": "jitter", "cases": cases, "timeout_s": 180} for n, cases in (
        (2, [[999, "float32", "avg"], [1, "float64", "sum"], [10_000, "bfloat16", "sum"]]),
        (5, [[12_345, "float64", "sum"], [4, "float32", "avg"], [77, "bfloat16", "avg"]]),
        (8, [[100_003, "float32", "sum"], [5, "bfloat16", "sum"], [64, "float64", "avg"]]),
    )),
    shortcuts=("course.collectives.allreduce:ring_allreduce", "course.collectives.allreduce:naive_allreduce",
               "course.collectives.allreduce:tree_allreduce"),
    hang_hint=("In a ring every rank sends before it receives: with a blocking dist.send each rank can wait for "
               "its right neighbour to receive while that neighbour waits too. Send with dist.isend, receive "
               "with dist.recv, then wait on the isend's request."),
)

__all__ = ["LAB", "check_on_rank", "cross_check", "expected", "inputs"]
