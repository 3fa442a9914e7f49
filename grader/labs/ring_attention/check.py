"""Lab (notebook 08b): the student writes causal ring attention over isend/irecv, forward and backward, with the
zigzag layout and the online-softmax merge.

On every rank :func:`check_on_rank` draws the run's seeded ``q, k, v`` and upstream gradient for the whole
sequence, keeps this rank's positions of the zigzag layout (the course's, so that each part is checked alone), and
calls the student's functions under a :class:`~course.runtime.comm_log.CommLog`:

* a **probe** forward whose queries are zero and whose values are one-hot: every allowed key then gets the same
  weight, so the output says which keys each query saw (the mask the student applied), merge or no merge;
* the forward on large scores (``SCORE_SCALE``: an ``exp`` without the running maximum overflows float32);
* the backward on ordinary scores, fed full attention's ``out`` and ``lse``, so it is judged on its own.

:func:`cross_check` assembles every rank's evidence outside the ranks: the mask seen, the forward against
attention under that mask (a wrong mask fails ``causal_mask`` alone), the gradients against the closed form of
``course.long_context.blockwise.block_backward`` under that mask, and the student's layout. Each comparison is
within rounding when every element is within a bound derived from the arithmetic (float32's unit roundoff, the
number of keys, the world size, the scores' and values' sizes: :mod:`grader.labs.ring_attention.bounds`); a miss
says "beyond rounding: a bug (bound B, seen E)", with the rank, the tensor and the query or key position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course import world
from course.long_context import balance, blockwise
from course.numerics.bounds import Verdict, verdict
from course.runtime.collective_names import functions
from course.runtime.comm_log import COLLECTIVES, SENDS, CommLog
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry
from grader.labs.ring_attention.bounds import backward_bounds, forward_bounds

RECEIVES = functions("recv")  # every receive's name, as the communication log names a call
CHECKS = (
    Check("layout", "zigzag_positions gives each position to one rank and every rank the same causal work", 2),
    Check("causal_mask", "each query attends to exactly the keys at or before its position", 2),
    Check("online_softmax", "the forward's out and lse equal full attention's, even with large scores", 3),
    Check("q_gradient", "the backward's dq equals full attention's", 2),
    Check("kv_gradients", "the backward's dk and dv equal full attention's, on the rank that holds those keys", 3),
    Check("ring", "every message goes to rank + 1 and comes from rank - 1 (isend/irecv)", 2),
    Check("messages", "forward: one message per step, world_size - 1 in all, each one block's keys and values; "
          "no collective", 2),
)
FORWARD_CHECKS = ("causal_mask", "online_softmax", "ring", "messages")
BACKWARD_CHECKS = ("q_gradient", "kv_gradients")
SCORE_SCALE = 40.0  # q's scale in the forward run: scores near 100, past float32's exp (e^89 > 3.4e38)


def problem(config: dict, scale: float = 1.0, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """``(q, k, v, dout)`` of the whole sequence, ``(B, H, S, D)`` each, from the run's seed, on ``device`` (drawn
    on the CPU); ``q`` times ``scale``."""
    generator = torch.Generator().manual_seed(config["seed"])
    shape = (config["batch"], config["heads"], config["seq_len"], config["head_dim"])
    q, k, v, dout = (torch.randn(shape, generator=generator).to(device) for _ in range(4))
    return scale * q, k, v, dout


def _attempted(checks: tuple[str, ...], what: str, call: Callable[[], Any]) -> tuple[Any, list[Finding]]:
    """``call()``, or None with a "not attempted" finding per check when it raises NotImplementedError."""
    try:
        return call(), []
    except NotImplementedError:
        text = f"Not attempted yet: your {what} still raises NotImplementedError."
        return None, [Finding(name, False, text) for name in checks]


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: the layout, the probe, the forward and the backward of the student's file."""
    rank, n, seq_len, device = dist.get_rank(), dist.get_world_size(), config["seq_len"], world.current().device
    layout = [positions.to(device) for positions in balance.layout("zigzag", n, seq_len)]
    mine = layout[rank]
    with CommLog() as log:
        forward = load_entry(path, "ring_attention_forward")
        backward = load_entry(path, "ring_attention_backward")
        zigzag = load_entry(path, "zigzag_positions")
        student_layout, found = _attempted(("layout",), "zigzag_positions",
                                           lambda: [zigzag(r, n, seq_len).tolist() for r in range(n)])
        probe, more = _attempted(FORWARD_CHECKS, "ring_attention_forward", lambda: _probe(forward, config, layout))
        found += more
        q, k, v, _ = problem(config, SCORE_SCALE, device)
        mark = log.mark()
        result = forward(q[..., mine, :], k[..., mine, :], v[..., mine, :], layout) if probe is not None else None
        forward_calls = log.since(mark)
        q, k, v, dout = problem(config, device=device)
        out, lse = blockwise.attention(q, k, v)
        mark = log.mark()
        grads, more = _attempted(BACKWARD_CHECKS, "ring_attention_backward", lambda: backward(
            dout[..., mine, :], q[..., mine, :], k[..., mine, :], v[..., mine, :], out[..., mine, :],
            lse[..., mine], layout))
        found += more
        backward_calls = log.since(mark)
    if probe is not None:
        found += [_ring(rank, n, forward_calls + backward_calls), _messages(rank, n, config, forward_calls,
                                                                            backward_calls)]
    evidence = {"layout": student_layout, "probe": probe,
                "forward": None if result is None else [t.detach().cpu() for t in result],
                "grads": None if grads is None else [t.detach().cpu() for t in grads]}
    return RankFindings(found, evidence)


def _probe(forward: Callable, config: dict, layout: list[torch.Tensor]) -> torch.Tensor:
    """Zero queries, one-hot values: row i of the output is 1/|keys seen| at each key query i saw."""
    seq_len, mine, device = config["seq_len"], layout[dist.get_rank()], world.current().device
    keys = torch.randn(1, 1, seq_len, seq_len, generator=torch.Generator().manual_seed(config["seed"] + 1)).to(device)
    values = torch.eye(seq_len, device=device)[None, None]
    out = forward(torch.zeros(1, 1, len(mine), seq_len, device=device), keys[..., mine, :], values[..., mine, :],
                  layout)[0]
    return out[0, 0].detach().cpu()


def _ring(rank: int, n: int, calls: list) -> Finding:
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for call in calls:
        if call.name in SENDS and call.peer != nxt:
            return Finding("ring", False, f"rank {rank} sent a message to rank {call.peer}; the ring passes each "
                           f"block to the next rank, (rank + 1) % world_size = {nxt}")
        if call.name in RECEIVES and call.peer != prv:
            return Finding("ring", False, f"rank {rank} received from rank {call.peer}; in the ring each rank "
                           f"receives from the previous one, (rank - 1) % world_size = {prv}")
    return Finding("ring", True)


def _messages(rank: int, n: int, config: dict, forward: list, backward: list) -> Finding:
    used = [c.name for c in forward + backward if c.name in COLLECTIVES]
    if used:
        return Finding("messages", False, f"rank {rank} called {used[0]}: ring attention moves blocks with "
                       "isend/irecv only, no collective")
    block = 2 * config["batch"] * config["heads"] * config["seq_len"] // n * config["head_dim"] * 4
    sends = [c.nbytes for c in forward if c.name in SENDS]
    if len(sends) != n - 1:
        return Finding("messages", False, f"rank {rank} sent {len(sends)} message(s) in forward; expected "
                       f"world_size - 1 = {n - 1}, one per step, with keys and values stacked in one tensor")
    wrong = [size for size in sends if size != block]
    if wrong:
        return Finding("messages", False, f"rank {rank} sent a forward message of {wrong[0]:,} bytes; one block's "
                       f"keys and values are {block:,} bytes (2 x B x H x S/world_size x D x 4)")
    return Finding("messages", True, f"{n - 1} messages of {block:,} bytes per rank in forward")


def cross_check(config: dict, evidence: list[dict]) -> list[Finding]:
    """Outside the ranks: the layout, the mask each query saw, the forward and the gradients under that mask."""
    n = len(evidence)
    layout = balance.layout("zigzag", n, config["seq_len"])
    found = [_layout(evidence[0]["layout"], n, config["seq_len"])]
    if any(e["probe"] is None for e in evidence):
        return found
    mask = torch.zeros(config["seq_len"], config["seq_len"], dtype=torch.bool)
    for rank, seen in enumerate(evidence):
        # a key seen gets weight 1 / (keys seen) >= 1 / seq_len; a key not seen 0, give or take rounding
        mask[layout[rank]] = seen["probe"] > 0.5 / config["seq_len"]
    found.append(_mask(mask, layout))
    if all(e["forward"] is not None for e in evidence):
        found.append(_forward(config, evidence, layout, mask))
    if all(e["grads"] is not None for e in evidence):
        found += _gradients(config, evidence, layout, mask)
    return found


def _layout(student: list | None, n: int, seq_len: int) -> Finding:
    if student is None:
        return Finding("layout", False, "Not attempted yet: your zigzag_positions still raises NotImplementedError.")
    held = sorted(p for positions in student for p in positions)
    if held != list(range(seq_len)):
        return Finding("layout", False, f"zigzag_positions over the {n} ranks does not hold every position "
                       f"0..{seq_len - 1} exactly once")
    work = [balance.causal_work(torch.tensor(p)) for p in student]
    if len(set(work)) > 1:
        return Finding("layout", False, f"the ranks' causal work (query-key pairs) is {work}: give rank r chunk r "
                       f"and chunk 2 x world_size - 1 - r of the {2 * n} chunks, so that every rank does the same")
    if [list(p) for p in student] != [p.tolist() for p in balance.layout("zigzag", n, seq_len)]:
        return Finding("layout", False, "the work is even but the positions differ from the zigzag: rank r holds "
                       "chunk r, then chunk 2 x world_size - 1 - r, in that order")
    return Finding("layout", True)


def _owner(position: int, layout: list[torch.Tensor]) -> int:
    return next(rank for rank, held in enumerate(layout) if position in held.tolist())


def _mask(mask: torch.Tensor, layout: list[torch.Tensor]) -> Finding:
    causal = torch.ones_like(mask).tril()
    if torch.equal(mask, causal):
        return Finding("causal_mask", True)
    i = int((mask != causal).any(1).nonzero()[0])
    extra = (mask[i] & ~causal[i]).nonzero().flatten().tolist()
    missing = (causal[i] & ~mask[i]).nonzero().flatten().tolist()
    said = (f"also saw the later key(s) {extra[:4]} (held by rank {_owner(extra[0], layout)})" if extra else
            f"missed the earlier key(s) {missing[:4]} (held by rank {_owner(missing[0], layout)})")
    return Finding("causal_mask", False, f"the query at position {i} (rank {_owner(i, layout)}) {said}. Build each "
                   "block's mask from the positions of the rank whose keys you hold at that step, "
                   "(rank - step) % world_size, not from your own")


def _finite(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``got`` is finite wherever ``expected`` is."""
    return bool(torch.isfinite(got[torch.isfinite(expected)]).all())


def _judged(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, positions: torch.Tensor) -> tuple[Verdict, str]:
    """The verdict, and the position (in the whole sequence) of its worst element."""
    judged = verdict(got, want, bound)
    at = f" at position {int(positions[judged.index[2]])}" if len(judged.index) > 2 else ""
    return judged, at


def _forward(config: dict, evidence: list[dict], layout: list[torch.Tensor], mask: torch.Tensor) -> Finding:
    q, k, v, _ = problem(config, SCORE_SCALE)
    out, lse = blockwise.attention(q, k, v, mask)
    out_bound, lse_bound = forward_bounds(q, k, v, mask, len(evidence))
    for rank, seen in enumerate(evidence):
        got_out, got_lse = seen["forward"]
        mine = layout[rank]
        for name, got, want, bound in (("out", got_out, out[..., mine, :], out_bound[..., mine, :]),
                                       ("lse", got_lse, lse[..., mine], lse_bound[..., mine])):
            if got.shape != want.shape:
                return Finding("online_softmax", False, f"rank {rank}'s {name} has shape {tuple(got.shape)}, "
                               f"expected {tuple(want.shape)}")
            if not _finite(got, want):
                return Finding("online_softmax", False, f"rank {rank}'s {name} holds inf or nan where attention is "
                               "finite: with scores near 100, exp(lse) overflows float32. Subtract the running "
                               "maximum, m = max(lse_a, lse_b), before exponentiating: exp(lse_a - m)")
            judged, at = _judged(got, want, bound, mine)
            if not judged.within:
                return Finding("online_softmax", False, f"rank {rank}'s {name} differs from full attention's"
                               f"{at}: {judged}. When a block raises a row's maximum, what was summed before "
                               "must be rescaled by exp(old maximum - new maximum)")
    return Finding("online_softmax", True, "out and lse within rounding of full attention's")


def _gradients(config: dict, evidence: list[dict], layout: list[torch.Tensor], mask: torch.Tensor) -> list[Finding]:
    q, k, v, dout = problem(config)
    out, lse = blockwise.attention(q, k, v)
    want = blockwise.block_backward(dout, q, k, v, out, lse, mask)  # (dq, dk, dv) under the mask the probe saw
    limits = backward_bounds(dout, q, k, v, out, lse, mask, len(evidence))
    found = []
    for check, names, indices in (("q_gradient", "q", (0,)), ("kv_gradients", "kv", (1, 2))):
        found.append(Finding(check, True))
        for rank, seen in enumerate(evidence):
            mine = layout[rank]
            if any(seen["grads"][i].shape != want[i][..., mine, :].shape for i in indices):
                found[-1] = Finding(check, False, f"rank {rank}'s gradients have shapes "
                                    f"{[tuple(seen['grads'][i].shape) for i in indices]}, expected "
                                    f"{tuple(want[0][..., mine, :].shape)} each")
                break
            judged = [(names[j], *_judged(seen["grads"][i], want[i][..., mine, :], limits[i][..., mine, :], mine))
                      for j, i in enumerate(indices)]
            bad = [(name, verdict_, at) for name, verdict_, at in judged if not verdict_.within]
            if bad:
                name, verdict_, at = bad[0]
                found[-1] = Finding(check, False, f"rank {rank}'s d{name} differs from full attention's{at}: "
                                    f"{verdict_}" + _return_hint(seen["grads"], want, limits, layout, rank, check))
                break
    return found


def _return_hint(got: list[torch.Tensor], want: tuple, limits: tuple, layout: list[torch.Tensor], rank: int,
                 check: str) -> str:
    """When dk on a rank equals the next rank's keys' dk, the last hop home is missing."""
    if check != "kv_gradients":
        return ""
    nxt = (rank + 1) % len(layout)
    if verdict(got[1], want[1][..., layout[nxt], :], limits[1][..., layout[nxt], :]).within:
        return (f"; it is the gradient of rank {nxt}'s keys, finished but never sent home. After the last step, "
                "send the partial dK, dV on once more, to rank + 1, and keep what arrives")
    return "; sum each block's dk, dv on every rank that uses it, and pass them on with the block"


def _run(world_size: int, seq_len: int, seed: int | str, label: str) -> dict:
    return {"world_size": world_size, "seq_len": seq_len, "seed": seed, "batch": 1, "heads": 2, "head_dim": 4,
            "label": label, "timeout_s": 120.0}


LAB = Lab(
    name="ring_attention",
    title="causal ring attention: the block loop and the online-softmax merge, forward and backward",
    notebook="08b_long_context_and_experts",
    student_file="labs/ring_attention.py",
    entry="ring_attention_forward",
    checks=CHECKS,
    rank_check=check_on_rank,
    cross_check=cross_check,
    runs=(_run(4, 24, 0, "sequence length {seq_len}"),),
    variant={"world_size": (4, 3), "seq_len": (24, 48)},  # both cut into 2 x world_size chunks
    hidden_runs=(_run(3, 48, "jitter", "sequence length 48"), _run(2, 16, "jitter", "sequence length 16")),
    shortcuts=tuple(f"course.long_context.{name}" for name in (
        "ring_attention:ring_forward", "ring_attention:ring_backward", "ring_attention:ring_attention",
        "ring_attention:RingAttention", "blockwise:merge", "blockwise:BlockwiseAttention", "balance:zigzag_positions",
        "balance:layout")),
    hang_hint=("A ring hangs when a rank waits for a block its neighbour never sends: every rank sends to rank + 1 "
               "and receives from rank - 1, the same number of times, and waits each request."),
)

__all__ = ["LAB", "check_on_rank", "cross_check", "problem"]
