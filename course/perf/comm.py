"""What moving gradients costs on a real cluster: transports, NICs per node, and the schemes that use them.

Every link is seen through its transport (:data:`course.perf.catalog.TRANSPORTS`): sustained bandwidth =
peak x the transport's fitted efficiency, latency = its fitted α (both from :mod:`course.perf.microbench`). A node
has ``nics_per_node`` network adapters; the GPUs of a node share them, so one GPU's share of the network is
``min(nics, gpus) x adapter bandwidth / gpus``. The algorithms' coefficients come from
:mod:`course.collectives.cost_model`:

* ``ring`` on one node: ``2(n-1)`` steps, ``2(n-1)/n·N`` bytes per link. Across nodes the ring crosses every
  node's adapters with the same ``2(n-1)/n·N`` bytes, and each step waits for the slower hop.
* ``pipelined_tree``: NCCL's double binary tree, **pipelined**: ``2⌈log₂n⌉`` steps of latency, about ``2·N``
  bytes per link (close to the ring). Across nodes the tree spans the nodes and a chain joins each node's ``g``
  GPUs: ``2⌈log₂nodes⌉ + 2(g-1)`` steps. Not the course's unpipelined binomial tree of notebook 04 (``tree``),
  which moves whole tensors at every level (``2⌈log₂n⌉·N``).
* ``hierarchical``: the one two-level formula, :func:`course.collectives.cost_model.predict_hierarchical`
  with ``within="ring"``: reduce-scatter inside each node, allreduce of each GPU's ``1/g`` shard across the nodes
  on its share of the adapters, all-gather inside the node.
* ``parameter_server`` with ``k`` server shards, one on each of ``k`` nodes: every worker pushes ``N/k`` to each
  shard and pulls ``N/k`` back; the bytes between a worker and the shard on its own node do not cross the
  network. The busiest adapter (a shard's node) carries ``max((n-g)·N/k, g·N·(k-1)/k)`` each way per phase.

Taught in ``notebooks/05c_performance_model.ipynb``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course.collectives import cost_model
from course.perf import microbench
from course.perf.catalog import Gpu, Link


def algorithms() -> tuple[str, ...]:
    """The allreduces this module prices, read from the table now (a row registered later counts): every algorithm
    of ``course.collectives.allreduce.ALGORITHMS`` (flat), NCCL's pipelined tree (modelled only) and the two-level
    hierarchical formula. "naive" is left out: the performance model's "naive" is nn.DataParallel's hub
    (:mod:`course.perf.model`), not the naive allreduce."""
    flat = (name for name in cost_model.ALGORITHMS if name != "naive")
    return (*flat, cost_model.PIPELINED_TREE, "hierarchical")


@dataclass(frozen=True)
class Cluster:
    """GPUs of one kind, ``gpus_per_node`` to a node joined by ``intra``; nodes joined by ``inter``, of which each
    node has ``nics_per_node`` adapters (a DGX-1 has 4, a DGX A100 8: one per GPU)."""

    gpu: Gpu
    intra: Link
    gpus_per_node: int = 8
    inter: Link | None = None  # None: a single node
    nics_per_node: int = 1

    def nodes(self, world_size: int) -> int:
        """Nodes that ``world_size`` GPUs fill, with a clear error if they do not fit."""
        nodes = math.ceil(world_size / self.gpus_per_node)
        if nodes > 1 and self.inter is None:
            raise ValueError(f"{world_size} GPUs need {nodes} nodes of {self.gpus_per_node}, but the cluster has "
                             "no inter-node link; pass inter=catalog.link('InfiniBand HDR') or similar.")
        return nodes

    def network_per_gpu(self) -> cost_model.AlphaBeta:
        """One GPU's share of its node's adapters, as the alpha-beta model sees it."""
        if self.inter is None:
            raise ValueError("a single-node cluster has no network; pass inter=... to the Cluster.")
        node = alpha_beta(self.inter)
        share = min(self.nics_per_node, self.gpus_per_node) / self.gpus_per_node
        return cost_model.AlphaBeta(node.alpha_s, node.beta_s_per_byte / share)

    def network_per_node(self) -> cost_model.AlphaBeta:
        """All of a node's adapters together (what a parameter-server shard's node can move)."""
        node = alpha_beta(self.inter)
        return cost_model.AlphaBeta(node.alpha_s, node.beta_s_per_byte / self.nics_per_node)


def alpha_beta(link: Link, _unused: object = None) -> cost_model.AlphaBeta:
    """The link as the alpha-beta model sees it through its transport: ``α`` = the transport's fitted latency,
    ``1/β`` = peak x the transport's fitted efficiency (:mod:`course.perf.microbench`). The second argument is
    ignored (older callers passed the model's assumptions; the efficiencies are no longer assumptions)."""
    efficiency = microbench.constant(f"efficiency.{link.transport}")
    return cost_model.AlphaBeta(microbench.constant(f"alpha.{link.transport}"), 1.0 / (link.bandwidth * efficiency))


def message_seconds(nbytes: float, link: cost_model.AlphaBeta) -> float:
    """One message of ``nbytes`` over one link: ``α + N·β``."""
    return link.alpha_s + nbytes * link.beta_s_per_byte


def server_seconds(nbytes: float, workers: int, link: cost_model.AlphaBeta) -> float:
    """One unsharded server on its own link: ``workers`` push ``nbytes``, then pull ``nbytes``, one after another:
    ``2 · workers · (α + N·β)``."""
    return 2 * workers * message_seconds(nbytes, link)


def allreduce_seconds(nbytes: float, world_size: int, cluster: Cluster, algorithm: str = "ring") -> float:
    """One allreduce of ``nbytes`` over ``world_size`` GPUs, by one of :func:`algorithms` (module docstring).

    Raises:
        ValueError: unknown algorithm, or more GPUs than one node without an inter-node link.
    """
    if algorithm not in algorithms():
        raise ValueError(f"allreduce algorithm must be one of {algorithms()}, got {algorithm!r}.")
    if world_size == 1:
        return 0.0
    nodes, inside = cluster.nodes(world_size), alpha_beta(cluster.intra)
    coefficient = "ring" if algorithm == "hierarchical" else algorithm
    if nodes == 1:
        return float(cost_model.predict(coefficient, nbytes, world_size, inside))
    g, between = cluster.gpus_per_node, cluster.network_per_gpu()
    if algorithm == "hierarchical":
        return float(cost_model.predict_hierarchical(nbytes, g, nodes, inside, between, within="ring"))
    # flat: every step waits for the slower hop; a GPU's bytes cross its node's adapters at its share of them
    slower = cost_model.AlphaBeta(max(inside.alpha_s, between.alpha_s),
                                  max(inside.beta_s_per_byte, between.beta_s_per_byte / g))
    a, b = cost_model.coefficients(coefficient, world_size)
    if coefficient == cost_model.PIPELINED_TREE:  # NCCL's tree spans the nodes; a chain inside each one, up and down
        a = cost_model.coefficients(coefficient, nodes)[0] + 2 * (g - 1)
    return a * slower.alpha_s + b * nbytes * slower.beta_s_per_byte


def server_phase_seconds(nbytes: float, world_size: int, cluster: Cluster, shards: int) -> float:
    """One phase (push, or pull) of a parameter server with ``shards`` shards on as many nodes (module docstring).

    Raises:
        ValueError: fewer than 1 shard, or more shards than nodes.
    """
    nodes = cluster.nodes(world_size)
    if not 1 <= shards <= nodes:
        raise ValueError(f"server shards must be between 1 and the {nodes} nodes, got {shards}.")
    if nodes == 1:  # one node: every worker's bytes go through the shard's GPU link
        return message_seconds(nbytes * (world_size - 1), alpha_beta(cluster.intra))
    g = min(world_size, cluster.gpus_per_node)
    busiest = max((world_size - g) * nbytes / shards, g * nbytes * (shards - 1) / shards)
    return message_seconds(busiest, cluster.network_per_node())
