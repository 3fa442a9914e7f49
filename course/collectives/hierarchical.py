"""Hierarchical allreduce: reduce inside each node, allreduce across nodes among leaders, broadcast back.

Inside a node the link is fast (NVLink, or here shared memory); between nodes it is slow (a network). A
flat ring over all ``n = nodes x ranks_per_node`` ranks sends ``2(n-1)`` messages, and every step waits for
the slow link. The hierarchical allreduce uses the slow link only among one *leader* per node::

    shm_reduce(tensor, group=node)                  # 1. the node's sum lands on its leader (local rank 0)
    if leader: ring_allreduce(tensor, group=leaders)  # 2. leaders allreduce across nodes: 2(m-1) steps, m nodes
    shm_broadcast(tensor, group=node)               # 3. the leader's result reaches every rank of its node

Same signature as ``course.collectives.allreduce``'s algorithms, plus how the ranks sit on nodes (``ranks_per_node``,
or found from the environment). ``course.collectives.cost_model.predict_hierarchical`` says what it costs. Taught in
``notebooks/05b_nodes.ipynb``; ``course.multinode.nodes`` runs it on two "nodes" joined by a slow link.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import world
from course.arguments import check_count
from course.collectives.allreduce import ALGORITHMS
from course.collectives.protocol import Op, op_name
from course.collectives.shm_allreduce import shm_broadcast, shm_reduce, validate_host_tensor
from course.collectives.shm_group import host

#: torchrun sets it to the node's index (its place in the rendezvous), the same for every rank of a node.
NODE_ENV = "GROUP_RANK"


@dataclass(frozen=True)
class Nodes:
    """How the ranks of a process group sit on nodes.

    Attributes:
        members: global ranks of each node, node by node; a node's first rank is its leader.
        node: index of my node in ``members``.
        local: process group of my node's ranks (None when I am alone on my node).
        leaders: process group of every node's leader, on leaders only (None elsewhere, or with one node).
    """

    members: tuple[tuple[int, ...], ...]
    node: int
    local: dist.ProcessGroup | None
    leaders: dist.ProcessGroup | None

    @property
    def is_leader(self) -> bool:
        return dist.get_rank() == self.members[self.node][0]

    @property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.members)


_nodes: dict[tuple[tuple[int, ...], int | None], Nodes | None] = {}
world.forget_on_shutdown(_nodes.clear)


def node_groups(ranks_per_node: int | None = None, ranks: Sequence[int] | None = None) -> Nodes | None:
    """Split ``ranks`` (default: every rank) into nodes. Collective over EVERY rank of the default group, in the
    same order (it makes process groups, as ``dist.new_group`` does); cached.

    Args:
        ranks_per_node: consecutive ranks per node (``4`` ranks with ``2``: nodes {0, 1} and {2, 3}), to
            emulate nodes on one machine; None finds them: ranks with the same host and the same torchrun
            ``GROUP_RANK`` (node index) share a node.
        ranks: the global ranks to split, in order (a sub-group's ranks).

    Returns:
        My :class:`Nodes`, or None if I am not one of ``ranks``.

    Raises:
        ValueError: ``ranks_per_node`` that does not divide the number of ranks.
    """
    ranks = tuple(range(dist.get_world_size())) if ranks is None else tuple(ranks)
    key = (ranks, ranks_per_node)
    if key in _nodes:
        return _nodes[key]
    if ranks_per_node is None:
        where = [None] * dist.get_world_size()
        dist.all_gather_object(where, (host(), os.environ.get(NODE_ENV, "")))
        places = [where[r] for r in ranks]
        members = tuple(tuple(r for r, w in zip(ranks, places, strict=True) if w == place)
                        for place in dict.fromkeys(places))
    else:
        ranks_per_node = check_count("ranks_per_node", ranks_per_node, unit="number of ranks")
        if len(ranks) % ranks_per_node:
            raise ValueError(f"ranks_per_node must be a positive divisor of the {len(ranks)} ranks, got "
                             f"{ranks_per_node!r}.")
        members = tuple(ranks[i:i + ranks_per_node] for i in range(0, len(ranks), ranks_per_node))
    me, leaders = dist.get_rank(), tuple(node_ranks[0] for node_ranks in members)
    local_groups = [dist.new_group(list(node_ranks)) if len(node_ranks) > 1 else None for node_ranks in members]
    leader_group = dist.new_group(list(leaders)) if len(leaders) > 1 else None
    node = next((i for i, node_ranks in enumerate(members) if me in node_ranks), None)
    _nodes[key] = None if node is None else Nodes(members, node, local_groups[node],
                                                  leader_group if me in leaders else None)
    return _nodes[key]


def hierarchical_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                           check: bool = True, ranks_per_node: int | None = None,
                           across: str = "ring") -> torch.Tensor:
    """Allreduce in three levels: shared-memory reduce in each node, ``across`` among leaders, broadcast.

    Args:
        tensor, op, group, check: as ``course.collectives.allreduce.ring_allreduce`` (CPU tensors: the node level is
            ``course.collectives.shm_allreduce``). A mismatch inside a node raises on that node's ranks and, through the
            leaders' check, on every other rank too.
        ranks_per_node: see :func:`node_groups` (None: find the nodes from the environment). The first call
            for a (group, ranks_per_node) makes process groups: on the default group every rank makes it at
            once; for a sub-group, call :func:`node_groups` on every rank first.
        across: the allreduce among leaders, a name from ``course.collectives.allreduce.ALGORITHMS``.

    Returns:
        ``tensor`` itself, holding the reduction over every rank of ``group``.

    Raises:
        ValueError: bad arguments, or ranks that disagree (with ``check``).
    """
    op = op_name(op)
    validate_host_tensor(tensor)
    if across not in ALGORITHMS:
        raise ValueError(f"across must be one of {sorted(ALGORITHMS)}, got {across!r}.")
    if group is None and not dist.is_initialized():
        return tensor  # a world of one
    ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    if (ranks, ranks_per_node) not in _nodes and len(ranks) != dist.get_world_size():
        raise ValueError(f"hierarchical_allreduce on a sub-group (ranks {list(ranks)}) needs its nodes first: call "
                         f"course.collectives.hierarchical.node_groups({ranks_per_node}, {list(ranks)}) on every rank "
                         "(it makes process groups, which every rank must join).")
    nodes = node_groups(ranks_per_node, ranks)
    inter: Callable[..., torch.Tensor] = ALGORITHMS[across]
    try:
        if nodes.local is not None:
            shm_reduce(tensor, "sum", nodes.local, check=check)
    except ValueError:
        if nodes.leaders is not None:  # tell the other leaders with a call that cannot match theirs, then raise
            with contextlib.suppress(ValueError):
                inter(torch.empty(0, dtype=tensor.dtype, device=tensor.device), "sum", nodes.leaders, check=True)
        raise
    failure = None
    if nodes.leaders is not None:
        try:
            inter(tensor, "sum", nodes.leaders, check=check)
        except ValueError as error:
            failure = error
    if nodes.local is not None:
        shm_broadcast(tensor, nodes.local, check=check, failed=failure is not None)
    if failure is not None:
        raise failure
    if op == "avg":
        tensor.div_(nodes.world_size)
    return tensor
