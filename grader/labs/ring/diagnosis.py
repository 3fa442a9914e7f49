"""Why a ring allreduce's result is wrong, read off the numbers: which chunk, by how much, and the likely mistake.

The lab's inputs are small integers (every sum is exact in float32, float64 and bfloat16), so a wrong chunk's
difference from the right answer says what happened: off by exactly one rank's input means that rank's chunk
was added twice (or never, if negative); the sum where the average was asked means the division was forgotten;
the same mistake on every rank means the reduce-scatter made it (the all-gather only passed it on). Used by
:mod:`grader.labs.ring` outside the ranks, on outputs the ranks returned and inputs the checker generated.
"""

from __future__ import annotations

import torch

from course.numerics import bounds


def allowed(inputs: torch.Tensor, op: str, dtype: torch.dtype) -> torch.Tensor:
    """How far a correct ring's result may be from the exact answer, element by element: derived, not set by hand.

    A sum of the ``world_size`` inputs (``(world_size, numel)``) in ``dtype``, in any order, errs by at most
    :func:`course.numerics.bounds.reduction_bound` on the sum of their magnitudes, and by nothing when they are
    integers whose magnitudes sum below ``1/u`` (every partial sum is then exact: the lab's inputs). An average
    may divide before or after summing: the general bound, divided by ``world_size``, plus the division's rounding.
    """
    world_size = inputs.shape[0]
    magnitude = inputs.abs().sum(dim=0)
    integers = bool((inputs == inputs.round()).all())
    exact = integers and bool((magnitude < 1 / bounds.unit_roundoff(dtype)).all())
    if op == "sum" and exact:
        return torch.zeros_like(magnitude)
    err = bounds.reduction_bound(magnitude, world_size, dtype)
    if op == "avg":
        err = err / world_size
    return err + bounds.cast_bound(expected(inputs, op).abs() + err, dtype)


def close(got: torch.Tensor, want: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """Elementwise: ``got`` is within ``limit`` of ``want`` (all float64)."""
    return (got - want).abs() <= limit


def expected(inputs: torch.Tensor, op: str) -> torch.Tensor:
    """The exact allreduce of ``inputs`` (world_size, numel), in float64."""
    total = inputs.sum(dim=0)
    return total / inputs.shape[0] if op == "avg" else total


def first_wrong(outputs: list[torch.Tensor], inputs: torch.Tensor, op: str, dtype: torch.dtype) -> str | None:
    """The first wrong chunk of any rank's output, explained; None if every rank holds the right answer."""
    world_size, numel = inputs.shape
    want = expected(inputs, op)
    spans = torch.tensor_split(torch.arange(numel), world_size)
    for rank, output in enumerate(outputs):
        if output is None or tuple(output.shape) != (numel,) or output.dtype != dtype:
            got = "nothing" if output is None else f"a {output.dtype} tensor of shape {tuple(output.shape)}"
            return f"rank {rank}'s tensor after the call is {got}, expected {numel} {dtype} elements (in place)"
    got = torch.stack([output.double() for output in outputs])  # (world_size, numel)
    limit = allowed(inputs, op, dtype)
    for chunk, index in enumerate(spans):
        bad = [rank for rank in range(world_size) if not bool(close(got[rank, index], want[index], limit[index]).all())]
        if bad:
            return _explain(got, inputs, want, op, dtype, limit, bad, chunk, index)
    return None


def _explain(got: torch.Tensor, inputs: torch.Tensor, want: torch.Tensor, op: str, dtype: torch.dtype,
             limit: torch.Tensor, bad: list[int], chunk: int, index: torch.Tensor) -> str:
    world_size = inputs.shape[0]
    rank = bad[0]
    ok = ~close(got[rank, index], want[index], limit[index])
    element = int(index[ok.nonzero()[0, 0]])
    value, right = float(got[rank, element]), float(want[element])
    where = (f"rank {rank}'s chunk {chunk} (elements {int(index[0])}-{int(index[-1])}) is off by {value - right:g} "
             f"at element {element} (got {value:g}, expected {right:g})")
    when = ("after the reduce-scatter: every rank has this chunk wrong, so the all-gather only passed the mistake on"
            if len(bad) == world_size else
            f"in the all-gather: rank(s) {', '.join(map(str, sorted(set(range(world_size)) - set(bad))))} have it "
            "right, so the reduced chunk was right but did not reach every rank intact")
    cause = _cause(got[rank, index], inputs[:, index], want[index], op, dtype, limit[index], rank)
    if cause.startswith(_DIVISION):  # a division is neither phase's mistake
        return f"{where} on every rank; {cause}" if len(bad) == world_size else f"{where}; {cause}"
    return f"{where} {when}; {cause}"


_DIVISION = ("it holds the sum", "it was divided")


def _cause(got: torch.Tensor, inputs: torch.Tensor, want: torch.Tensor, op: str, dtype: torch.dtype,
           limit: torch.Tensor, rank: int) -> str:
    """The likeliest mistake behind one wrong chunk (got, want: (k,); inputs: (world_size, k))."""
    world_size = inputs.shape[0]
    scale = world_size if op == "avg" else 1
    total = inputs.sum(dim=0)

    def matches(candidate: torch.Tensor) -> bool:
        # a mistake rounds too: up to two divisions of the candidate in the run's dtype
        return bool(close(got, candidate, limit + 2 * bounds.cast_bound(candidate.abs(), dtype)).all())

    if matches(torch.zeros_like(want)):
        return "it is all zeros: nothing was written into it (receive into the chunk itself, or copy into it)"
    if op == "avg" and matches(total):
        return "it holds the sum, not the average: op='avg' divides the sum by world_size once, at the end"
    if op == "avg" and matches(total / world_size**2):
        return "it was divided by world_size twice: divide once, after the all-gather"
    if op == "sum" and matches(total / world_size):
        return "it was divided by world_size, but op='sum' asks for the plain sum"
    if matches(inputs[rank] / scale):
        return f"it still holds rank {rank}'s own input: nothing arrived in this chunk"
    for other in range(world_size):
        if matches(want + inputs[other] / scale):
            return (f"it is off by exactly rank {other}'s input: rank {other}'s chunk was added twice (it looks like "
                    "a rank added its own chunk twice: what it receives already contains the sender's sum, add only "
                    "that into your chunk)")
        if matches(want - inputs[other] / scale):
            return (f"rank {other}'s input is missing from it: rank {other}'s chunk was never added (did the "
                    "reduce-scatter run world_size - 1 steps, and did each add what it received?)")
    return "the difference matches no single rank's input: check which chunk each step sends and receives"
