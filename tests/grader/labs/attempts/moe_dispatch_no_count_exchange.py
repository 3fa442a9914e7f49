"""Wrong attempt (moe_dispatch): no exchange of the split sizes: each rank takes its own counts for what it receives."""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

STUDENT_ID = ""  # your student id (the one you log in with): the check draws your own variant from it


# Given: the router, the capacity rule, an all-to-all with autograd, and the experts' run. Use them as they are.
def route(x, router_weight, k):
    """x: (T, d) tokens; router_weight: (E, d). Returns (gates, chosen): (T, k) weights and expert indices."""
    probs = torch.softmax(x @ router_weight.T, dim=-1)
    gates, chosen = probs.topk(k, dim=-1)
    return (gates / gates.sum(-1, keepdim=True) if k > 1 else gates), chosen


def capacity_limit(tokens, num_experts, k, factor):
    """How many assignments one expert takes from this rank's tokens."""
    return math.ceil(factor * tokens * k / num_experts)


def within_capacity(chosen, num_experts, limit):
    """(T, k) booleans: True where the assignment fits (first choices of every token first, in token order)."""
    order = chosen.T.reshape(-1)
    one_hot = torch.nn.functional.one_hot(order, num_experts)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1).reshape(chosen.shape[1], chosen.shape[0]).T
    return slot < limit


class AllToAll(torch.autograd.Function):
    """dist.all_to_all_single with autograd: its backward sends the gradients back, splits swapped."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits):
        ctx.splits = (output_splits, input_splits)
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        out = grad.new_empty((sum(input_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), input_splits, output_splits)
        return out, None, None


def all_to_all(x, output_splits, input_splits):
    """Rows input_splits[j] of x go to rank j; returns the rows received, output_splits[i] from rank i."""
    return AllToAll.apply(x, output_splits, input_splits)


class Plan(NamedTuple):
    """What dispatch did, for the experts and for combine."""

    token: torch.Tensor            # (R,) the token of each row sent, in the order sent
    choice: torch.Tensor           # (R,) which of its k choices that row is
    send: list                     # rows sent to each rank
    receive: list                  # rows received from each rank
    received_counts: torch.Tensor  # (world_size, E / world_size): rows from each rank for each of my experts


def run_experts(arrived, plan, experts):
    """Rows arrive by source rank, then by my expert: run each of my experts on its rows, keep the order."""
    mine = torch.arange(len(experts), device=arrived.device)
    which = torch.repeat_interleave(mine.repeat(plan.received_counts.shape[0]), plan.received_counts.reshape(-1))
    out = torch.zeros_like(arrived)
    for index, expert in enumerate(experts):
        rows = (which == index).nonzero(as_tuple=True)[0]
        out = out.index_copy(0, rows, expert(arrived[rows]))
    return out


def moe_forward(x, router_weight, experts, num_experts, k, capacity_factor):
    """The layer on this rank: x (T, d) -> (T, d). experts: this rank's E / world_size experts."""
    gates, chosen = route(x, router_weight, k)
    kept = within_capacity(chosen, num_experts, capacity_limit(x.shape[0], num_experts, k, capacity_factor))
    arrived, plan = dispatch(x, chosen, kept, num_experts)
    return combine(run_experts(arrived, plan, experts), plan, gates, x.shape[0])


# Yours: the count exchange, dispatch and combine.
def exchange_counts(counts):
    """counts: (E,) int64, the rows this rank sends to each expert (rank r holds experts r*E/n .. (r+1)*E/n - 1).
    Returns (world_size, E / world_size): the rows each rank sends to each of this rank's experts."""
    return counts.reshape(dist.get_world_size(), -1)  # assumes it receives what it sends


def dispatch(x, chosen, kept, num_experts):
    """Send each kept (token, choice) to its expert's rank: keep only kept assignments, sort them by expert,
    exchange the counts, then all_to_all the rows. Returns (arrived rows, Plan)."""
    token, choice = kept.nonzero(as_tuple=True)
    order = torch.argsort(chosen[token, choice], stable=True)
    token, choice = token[order], choice[order]
    counts = torch.bincount(chosen[token, choice], minlength=num_experts)
    received_counts = exchange_counts(counts)
    send = counts.reshape(dist.get_world_size(), -1).sum(1).tolist()
    receive = received_counts.sum(1).tolist()
    return all_to_all(x[token], receive, send), Plan(token, choice, send, receive, received_counts)


def combine(expert_out, plan, gates, num_tokens):
    """Send the experts' rows back (the splits reversed), weight each by its gate, add it at its token.
    Returns (num_tokens, d)."""
    returned = all_to_all(expert_out, plan.send, plan.receive)
    weighted = gates[plan.token, plan.choice, None] * returned
    return torch.zeros(num_tokens, expert_out.shape[1], device=expert_out.device).index_add(0, plan.token, weighted)


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/moe_dispatch.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(0)
    router_weight, x = torch.randn(4, 8), torch.randn(16, 8)
    mine = [torch.nn.Linear(8, 8) for _ in range(4)][me.rank * 4 // me.world_size:(me.rank + 1) * 4 // me.world_size]
    y = moe_forward(x + me.rank, router_weight, mine, 4, 2, 1.0)
    world.print0(f"moe_forward on {me.world_size} ranks: output of shape {tuple(y.shape)}")
    world.shutdown()
