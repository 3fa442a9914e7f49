"""Expert parallelism: the experts of a mixture-of-experts layer split over the ranks, tokens sent to them and back
with two all-to-alls (GShard, Lepikhin et al. 2020, arXiv:2006.16668).

Rank ``r`` keeps experts ``r·E/n .. (r+1)·E/n - 1`` and routes its own tokens (the router is replicated, as
under data parallelism). A forward is five named steps::

    route      top-k gating and capacity on this rank's tokens (moe.MoELayer.route)
    permute    the kept (token, choice) pairs sorted by expert, so each rank's share is one contiguous run
    counts     all_to_all_single of the per-expert counts: each rank learns how many rows it will receive
    dispatch   all_to_all_single of the rows, with those split sizes; the experts run on what arrived
    combine    all_to_all_single back (the splits reversed), rows put back at their tokens, weighted by gates

The split sizes must be exchanged first: a receiver cannot size its buffer otherwise. The backward of an
all-to-all is the all-to-all with the splits swapped (:class:`AllToAll`). Taught in
``notebooks/08b_long_context_and_experts.ipynb``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from course import world
from course.experts.moe import Config, MoELayer, build
from course.runtime.comm_log import CommLog

#: all_to_all_single calls per layer and step: forward counts, dispatch, combine; backward combine's and dispatch's
ALL_TO_ALLS = {"forward": 3, "backward": 2}


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with autograd: rows ``input_splits[j]`` go to rank ``j``; backward sends the
    gradients back the same way, splits swapped."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, output_splits: list[int], input_splits: list[int],  # noqa: ANN001
                group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.splits, ctx.group = (output_splits, input_splits), group
        return _all_to_all(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # noqa: ANN001
        output_splits, input_splits = ctx.splits
        return _all_to_all(grad, input_splits, output_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int],
                group: dist.ProcessGroup | None) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x, output_splits, input_splits, group=group)
    return out


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``(E,)`` rows this rank sends to each expert -> ``(n, E/n)`` rows each rank sends to each of mine."""
    n = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)  # E/n counts to each rank
    return received.reshape(n, -1)


class ExpertParallelMoE(nn.Module):
    """This rank's share of a :class:`~course.experts.moe.MoELayer`: the whole router, ``E/n`` experts.

    Raises:
        ValueError: a number of experts that the group's size does not divide.
    """

    def __init__(self, layer: MoELayer, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        experts = layer.config.num_experts
        if experts % n:
            raise ValueError(f"{experts} experts do not split evenly over {n} ranks: use a number of ranks that "
                             "divides the number of experts.")
        self.group, self.layer, self.local = group, copy.deepcopy(layer), experts // n
        self.layer.experts = nn.ModuleList(self.layer.experts[rank * self.local:(rank + 1) * self.local])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = self.layer.routing = self.layer.route(x)
        token, choice = routing.kept.nonzero(as_tuple=True)
        order = torch.argsort(routing.experts[token, choice], stable=True)  # permute: by expert
        token, choice = token[order], choice[order]
        counts = torch.bincount(routing.experts[token, choice], minlength=self.layer.config.num_experts)
        received_counts = exchange_counts(counts, self.group)  # (n, E/n)
        send = counts.reshape(-1, self.local).sum(1).tolist()
        receive = received_counts.sum(1).tolist()
        arrived = AllToAll.apply(x[token], receive, send, self.group)  # dispatch
        returned = AllToAll.apply(self._run_experts(arrived, received_counts), send, receive, self.group)
        weighted = routing.gates[token, choice, None] * returned  # combine
        return torch.zeros_like(x).index_add(0, token, weighted)

    def _run_experts(self, arrived: torch.Tensor, received_counts: torch.Tensor) -> torch.Tensor:
        """Rows arrive by source rank, then by my expert: run each expert on its rows, keep the rows' order."""
        n = received_counts.shape[0]
        which = torch.repeat_interleave(torch.arange(self.local, device=arrived.device).repeat(n),
                                        received_counts.reshape(-1))
        out = torch.zeros_like(arrived)
        for index, expert in enumerate(self.layer.experts):
            rows = (which == index).nonzero(as_tuple=True)[0]
            out = out.index_copy(0, rows, expert(arrived[rows]))
        return out


def tokens(config: Config, per_rank: int, rank: int, seed: int = 0) -> torch.Tensor:
    """``(per_rank, d_model)`` tokens of ``rank``, drawn on the CPU from ``seed`` (rank's own share)."""
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(per_rank, config.d_model, generator=generator)


def step_on_rank(config: Config, per_rank: int = 16, seed: int = 0) -> dict:
    """Run inside a launched rank: one expert-parallel forward and backward beside the one-process layer.

    The reference runs the whole layer on each rank's tokens in turn (each a group, as under expert parallelism)
    and sums the experts' gradients over the groups.

    Returns:
        ``{"out_error", "input_grad_error", "router_grad_error", "expert_grad_error", "dropped", "kept",
        "calls": [(name, bytes received)]}`` on this rank; errors are largest absolute differences.
    """
    rank, n, device = dist.get_rank(), dist.get_world_size(), world.current().device
    full = build(config).to(device)
    parallel = ExpertParallelMoE(full)
    x = tokens(config, per_rank, rank, seed).to(device).requires_grad_()
    upstream = tokens(config, per_rank, n + rank, seed).to(device)
    with CommLog() as log:
        y = parallel(x)
        ((y * upstream).sum() + 0.01 * parallel.layer.routing.loss).backward()
    mine, reference = _reference(full, config, per_rank, seed, rank, n, device)
    local = parallel.layer.experts
    owned = range(rank * parallel.local, (rank + 1) * parallel.local)
    return {"out_error": float((y.detach() - mine["y"]).abs().max()),
            "input_grad_error": float((x.grad - mine["x"]).abs().max()),
            "router_grad_error": float((parallel.layer.router.weight.grad - mine["router"]).abs().max()),
            "expert_grad_error": max(float((p.grad - q.grad).abs().max()) for i, e in zip(owned, local, strict=True)
                                     for p, q in zip(e.parameters(), reference.experts[i].parameters(), strict=True)),
            "dropped": parallel.layer.routing.dropped, "kept": int(parallel.layer.routing.kept.sum()),
            "calls": [(c.name, c.nbytes) for c in log.calls]}


def _reference(full: MoELayer, config: Config, per_rank: int, seed: int, rank: int, n: int,
               device: torch.device) -> tuple[dict, MoELayer]:
    """The one-process layer on every rank's tokens in turn: this rank's output and gradients, and the layer
    whose experts' gradients are summed over all the groups."""
    reference = copy.deepcopy(full)
    mine: dict = {}
    for source in range(n):
        reference.router.weight.grad = None  # the router's gradient is per group (each rank's, before DP)
        x = tokens(config, per_rank, source, seed).to(device).requires_grad_()
        y = reference(x)
        ((y * tokens(config, per_rank, n + source, seed).to(device)).sum() + 0.01 * reference.routing.loss).backward()
        if source == rank:
            mine = {"y": y.detach(), "x": x.grad, "router": reference.router.weight.grad.clone()}
    return mine, reference


def replica_groups(world_size: int, expert_parallel: int) -> dict[str, list[list[int]]]:
    """Expert parallelism combined with data parallelism: which ranks exchange tokens, which average gradients.

    Ranks ``[g·ep, (g+1)·ep)`` form an expert-parallel group (tokens travel inside it, each rank one share of the
    experts; keep it inside a node, where NVLink is). Ranks holding the same share (``r mod ep``) across groups
    average their experts' gradients; the router and every dense layer average over all ranks.

    Raises:
        ValueError: an expert-parallel size that does not divide the world size.
    """
    if world_size % expert_parallel:
        raise ValueError(f"expert_parallel={expert_parallel} must divide world_size={world_size}.")
    groups = world_size // expert_parallel
    return {"expert_parallel": [list(range(g * expert_parallel, (g + 1) * expert_parallel)) for g in range(groups)],
            "expert_data_parallel": [list(range(r, world_size, expert_parallel)) for r in range(expert_parallel)],
            "dense_data_parallel": [list(range(world_size))]}
