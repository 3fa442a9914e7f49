"""Lab (notebook 08b): the student writes expert parallelism's count exchange, dispatch and combine with
``all_to_all_single``; each part is checked alone, the others being the course's.

On every rank :func:`check_on_rank` loads the student's file and:

* calls ``exchange_counts`` on counts that name their sender (``100 x rank + expert``) and compares what arrived;
  then the course's exchange replaces it in the student's module, so that a wrong one fails only ``split_sizes``;
* routes the run's seeded tokens with the course's router and capacity (``course.experts``), calls the student's
  ``dispatch``, and checks that the rows sent are exactly the kept assignments (``capacity``); then runs the
  experts and the course's combine, forward and backward, against the one-process MoE layer on every rank's
  tokens (``outputs``: judged at the capacity the dispatch enforced, so that ignoring it fails only ``capacity``),
  within a bound derived from the arithmetic (:mod:`.bounds`: the rows each expert sums, the ranks, the magnitudes
  seen), the first tensor beyond it named (:mod:`course.numerics.divergence`);
* calls the student's ``combine`` on two probes of the course's dispatch: rows that carry their token's id with
  unit gates (``token_order``), and rows of ones, nothing dropped, every gate 0.3
  (``gates``: every token's sum is then the same whatever the order), each token within the rounding of adding its
  ``k`` weighted rows.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
import torch.distributed as dist

from course import world
from course.experts import expert_parallel, moe
from course.experts import router as gating
from course.numerics import bounds as numerics
from course.numerics.divergence import FORWARD, GRADIENT, Record, first_divergence
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry
from grader.labs.moe_dispatch import bounds

CHECKS = (
    Check("split_sizes", "exchange_counts tells each rank how many rows every rank sends to each of its experts", 2),
    Check("capacity", "dispatch sends exactly the assignments that fit under capacity, the others dropped", 2),
    Check("outputs", "forward and backward through your dispatch equal the one-process MoE layer's", 3),
    Check("token_order", "combine puts each returned row back at its own token", 2),
    Check("gates", "combine weights each returned row by its gate", 2),
)


class Plan(NamedTuple):
    """The course's dispatch plan, with the fields of the stub's ``Plan``."""

    token: torch.Tensor
    choice: torch.Tensor
    send: list
    receive: list
    received_counts: torch.Tensor


def _exchange_counts(counts: torch.Tensor) -> torch.Tensor:
    """The course's count exchange, put in the student's module in place of theirs once it has been checked."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous())
    return received.reshape(dist.get_world_size(), -1)


def _config(config: dict, factor: float | None = None) -> moe.Config:
    return moe.Config(num_experts=config["num_experts"], k=config["k"], seed=config["seed"],
                      capacity_factor=config["capacity_factor"] if factor is None else factor)


def _routing(layer: moe.MoELayer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(gates, chosen, kept)`` of the course's router and capacity for the tokens ``x``."""
    routing = layer.route(x)
    return routing.gates, routing.experts, routing.kept


def _dispatch(x: torch.Tensor, chosen: torch.Tensor, kept: torch.Tensor, num_experts: int
              ) -> tuple[torch.Tensor, Plan]:
    """The course's dispatch (``course.experts.expert_parallel``), returning the stub's plan."""
    token, choice = kept.nonzero(as_tuple=True)
    order = torch.argsort(chosen[token, choice], stable=True)
    token, choice = token[order], choice[order]
    counts = torch.bincount(chosen[token, choice], minlength=num_experts)
    received = _exchange_counts(counts)
    send, receive = counts.reshape(dist.get_world_size(), -1).sum(1).tolist(), received.sum(1).tolist()
    return expert_parallel.AllToAll.apply(x[token], receive, send, None), Plan(token, choice, send, receive, received)


def _combine(expert_out: torch.Tensor, plan: Plan, gates: torch.Tensor, num_tokens: int) -> torch.Tensor:
    returned = expert_parallel.AllToAll.apply(expert_out, plan.send, plan.receive, None)
    weighted = gates[plan.token, plan.choice, None] * returned
    return torch.zeros(num_tokens, expert_out.shape[1], device=expert_out.device).index_add(0, plan.token, weighted)


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: the count exchange, the dispatch end to end, and the combine's two probes."""
    dispatch = load_entry(path, "dispatch")
    combine = load_entry(path, "combine")
    exchange = load_entry(path, "exchange_counts")
    found = [_split_sizes(exchange, config)]
    dispatch.__globals__["exchange_counts"] = _exchange_counts  # each part judged alone
    found += _through_dispatch(dispatch, config)
    found += _combine_probes(combine, config)
    return RankFindings(found)


def _split_sizes(exchange: object, config: dict) -> Finding:
    rank, n, experts = dist.get_rank(), dist.get_world_size(), config["num_experts"]
    got = exchange(100 * rank + torch.arange(experts, device=world.current().device))
    share = experts // n
    want = torch.tensor([[100 * source + rank * share + e for e in range(share)] for source in range(n)])
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not torch.equal(got.cpu().to(want.dtype), want):
        shown = got.tolist() if isinstance(got, torch.Tensor) else got  # .tolist() reads a GPU tensor too
        return Finding("split_sizes", False, f"rank {rank}'s exchange_counts returned {shown}, but ranks 0..{n - 1} "
                       f"send it {want.tolist()} rows for its experts: a rank cannot know what it will receive "
                       "until the counts are exchanged, with all_to_all_single, before the rows")
    return Finding("split_sizes", True)


def _through_dispatch(dispatch: object, config: dict) -> list[Finding]:
    """The student's dispatch, the course's experts and combine: rows sent, then forward and backward."""
    rank, n, device = dist.get_rank(), dist.get_world_size(), world.current().device
    layer = moe.build(_config(config)).to(device)
    x = expert_parallel.tokens(layer.config, config["tokens"], rank, config["seed"]).to(device).requires_grad_()
    gates, chosen, kept = _routing(layer, x)
    share = config["num_experts"] // n
    mine = copy.deepcopy(layer.experts[rank * share:(rank + 1) * share])
    arrived, plan = dispatch(x, chosen, kept, config["num_experts"])
    sent = sorted(zip(plan.token.tolist(), plan.choice.tolist(), strict=True))
    fits = sorted(map(tuple, kept.nonzero().tolist()))
    everything = len(sent) == kept.numel() and len(fits) < kept.numel()
    limit = gating.capacity(config["tokens"], config["num_experts"], config["k"], config["capacity_factor"])
    capacity = Finding("capacity", sent == fits, "" if sent == fits else
                       f"rank {rank} sent {len(sent)} rows, but {len(fits)} of its {kept.numel()} assignments fit "
                       f"under capacity {limit}: send only the kept ones (within_capacity); the rest are dropped")
    y = _combine(_run_experts(arrived, plan, mine), plan, gates, x.shape[0])
    upstream = expert_parallel.tokens(layer.config, config["tokens"], n + rank, config["seed"]).to(device)
    (y * upstream).sum().backward()
    reference = moe.build(_config(config, 1e9 if everything else None)).to(device)  # the capacity enforced
    expected = _reference(reference, config, rank, n)
    xs, upstreams = ([expert_parallel.tokens(layer.config, config["tokens"], first + s, config["seed"])
                      for s in range(n)] for first in (0, n))
    limits = bounds.comparison_bounds(reference, xs, upstreams, rank, list(range(rank * share, (rank + 1) * share)))
    return [capacity, _outputs(rank, y, x, mine, expected, reference, share, limits)]


def _run_experts(arrived: torch.Tensor, plan: Plan, experts: torch.nn.ModuleList) -> torch.Tensor:
    mine = torch.arange(len(experts), device=arrived.device)
    which = torch.repeat_interleave(mine.repeat(plan.received_counts.shape[0]),
                                    torch.as_tensor(plan.received_counts, device=arrived.device).reshape(-1))
    out = torch.zeros_like(arrived)
    for index, expert in enumerate(experts):
        rows = (which == index).nonzero(as_tuple=True)[0]
        out = out.index_copy(0, rows, expert(arrived[rows]))
    return out


def _reference(layer: moe.MoELayer, config: dict, rank: int, n: int) -> dict:
    """The one-process layer on each rank's tokens in turn (the router's gradients are ranks' 0 .. n-1 summed
    for the experts; this rank's output and input gradient)."""
    mine: dict = {}
    device = world.current().device
    for source in range(n):
        x = expert_parallel.tokens(layer.config, config["tokens"], source, config["seed"]).to(device).requires_grad_()
        y = layer(x)
        upstream = expert_parallel.tokens(layer.config, config["tokens"], n + source, config["seed"]).to(device)
        (y * upstream).sum().backward()
        if source == rank:
            mine = {"y": y.detach(), "x": x.grad}
    return mine


def _outputs(rank: int, y: torch.Tensor, x: torch.Tensor, mine: torch.nn.ModuleList, expected: dict,
             reference: moe.MoELayer, share: int, limits: dict[str, torch.Tensor]) -> Finding:
    """The rank's output, then its experts' gradients as backward makes them, then its tokens' gradient, each
    against the one-process layer's within ``limits`` (:func:`.bounds.comparison_bounds`); the first beyond named."""
    ours, theirs, bound = [Record("the MoE layer", FORWARD, 0, rank, _cpu(y))], [], {"the MoE layer": limits["y"]}
    theirs.append(Record("the MoE layer", FORWARD, 0, rank, _cpu(expected["y"])))
    for i in reversed(range(len(mine))):
        e = rank * share + i
        params = dict(mine[i].named_parameters())
        for name, q in reversed(list(reference.experts[e].named_parameters())):
            label = f"experts.{e}.{name}"
            ours.append(Record(label, GRADIENT, 0, rank, _cpu(params[name].grad)))
            theirs.append(Record(label, GRADIENT, 0, rank, _cpu(q.grad)))
            bound[label] = limits[f"{e}.{name}"]
    ours.append(Record("x", GRADIENT, 0, rank, _cpu(x.grad)))
    theirs.append(Record("x", GRADIENT, 0, rank, _cpu(expected["x"])))
    bound["x"] = limits["x"]
    divergence = first_divergence(ours, theirs, lambda record, _: bound[record.name])
    if divergence is None:
        return Finding("outputs", True)
    return Finding("outputs", False, f"{divergence}. Send the kept rows sorted by expert, so that each rank's share "
                   "is one contiguous run, and x[token] itself (not a copy without gradient)")


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().cpu()


def _combine_probes(combine: object, config: dict) -> list[Finding]:
    """Two calls of the student's combine on the course's dispatch: token ids with unit gates, ones with the
    same gates on every token. Each probe is blind to the other mistake."""
    rank, device = dist.get_rank(), world.current().device
    layer = moe.build(_config(config)).to(device)
    x = expert_parallel.tokens(layer.config, config["tokens"], rank, config["seed"]).to(device)
    gates, chosen, kept = (t.detach() for t in _routing(layer, x))
    tokens, width = x.shape
    ids = torch.arange(tokens, dtype=x.dtype, device=device)[:, None].expand(tokens, width).contiguous()
    arrived, plan = _dispatch(ids, chosen, kept, config["num_experts"])  # identity experts: rows keep their id
    got = combine(arrived, plan, torch.ones_like(gates), tokens)
    want = kept.sum(1, dtype=x.dtype)[:, None] * ids
    found = [_probe("token_order", rank, got, want, config["k"], lambda t: (
        f"token {t} on rank {rank} got back rows of token(s) "
        f"{sorted({round(float(got[t, 0]) / max(int(kept[t].sum()), 1))})}: add each returned row at "
        "plan.token, the token it was sent for, not in the order the rows came back"))]
    same = torch.full_like(gates, 0.3)  # one gate for every row: any order of k rows per token sums the same
    every = torch.ones_like(kept)  # nothing dropped: every token then gets the same sum, in any order
    arrived, plan = _dispatch(torch.ones_like(x), chosen, every, config["num_experts"])
    got = combine(arrived, plan, same, tokens)
    want = same.sum(1)[:, None].expand(tokens, width)
    found.append(_probe("gates", rank, got, want, config["k"], lambda t: (
        f"token {t} on rank {rank} got {float(got[t, 0]):.3g} from experts that each returned 1 with gates "
        f"{[round(g, 3) for g in same[t].tolist()]}: multiply each returned row by its gate, "
        "gates[plan.token, plan.choice], before adding it at its token")))
    return found


def _probe(check: str, rank: int, got: object, want: torch.Tensor, k: int, explain: object) -> Finding:
    """``got`` against ``want``, each token within the rounding of adding its ``k`` weighted rows
    (:func:`.bounds.combine_bound`; the probes' rows and gates are >= 0, so ``|want|`` is ``sum |gate x row|``);
    the first token beyond named."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return Finding(check, False, f"rank {rank}'s combine returned {shape}, expected {tuple(want.shape)}")
    limit = bounds.combine_bound(want.detach().cpu().double().abs(), k)
    error = (got.detach().cpu().double() - want.detach().cpu().double()).abs().nan_to_num(float("inf"))
    wrong = (error > limit).any(1).nonzero()
    if len(wrong) == 0:
        return Finding(check, True)
    token = int(wrong[0])
    judged = numerics.verdict(got[token].detach().cpu(), want[token].cpu(), limit[token])
    return Finding(check, False, f"{explain(token)} ({judged})")


def _run(world_size: int, experts: int, factor: float, seed: int | str) -> dict:
    return {"world_size": world_size, "num_experts": experts, "k": 2, "capacity_factor": factor, "tokens": 16,
            "seed": seed, "label": "capacity factor {capacity_factor}", "timeout_s": 120.0}


LAB = Lab(
    name="moe_dispatch",
    title="expert parallelism: dispatch and combine with all_to_all_single",
    notebook="08b_long_context_and_experts",
    student_file="labs/moe_dispatch.py",
    entry="dispatch",
    checks=CHECKS,
    rank_check=check_on_rank,
    runs=(_run(4, 4, 0.75, 0),),
    variant={"world_size": (4, 2), "capacity_factor": (0.75, 0.5)},  # below 1: some tokens are always dropped
    hidden_runs=(_run(3, 6, 0.75, "jitter"), _run(2, 4, 0.5, "jitter")),
    shortcuts=tuple(f"course.experts.expert_parallel:{name}" for name in ("ExpertParallelMoE", "exchange_counts")),
    hang_hint=("An all-to-all hangs when a rank skips it or sizes differ: every rank calls all_to_all_single the "
               "same number of times, and each rank's output split sizes are what the others send it."),
)

__all__ = ["LAB", "check_on_rank"]
