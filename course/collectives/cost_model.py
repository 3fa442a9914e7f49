"""What an allreduce costs: the alpha-beta model, fitted on this machine, checked against measurements.

Sending one message of ``N`` bytes over one link costs ``T = α + N·β``: ``α`` (seconds) is the latency
every message pays, ``β`` (seconds per byte) is one over the link's bandwidth. An allreduce of ``N``
bytes over ``n`` ranks is a sequence of steps; each step costs ``α`` plus the bytes its busiest link
carries times ``β``, so every algorithm costs ``T = a·α + b·N·β`` with its own ``a`` and ``b``
(:func:`coefficients`; the allreduce algorithms' rows of ``course.collectives.allreduce.ALGORITHMS`` hold them):

=========  ==================  ======================  =============================================
algorithm  a (steps)           b (bytes per N, busiest  why
                               link)
=========  ==================  ======================  =============================================
naive      2(n-1)              2(n-1)                  rank 0 receives n-1 tensors, then sends n-1
ring       2(n-1)              2(n-1)/n                2(n-1) steps, each moving one 1/n chunk
tree       2⌈log2 n⌉           2⌈log2 n⌉               ⌈log2 n⌉ rounds up, as many down, whole tensors
                                                       (a binomial tree, **unpipelined**: notebook 04's)
pipelined  2⌈log2 n⌉           2 (1 when n = 2)        NCCL's tree: the tensor cut into chunks that flow
_tree                                                  up and down at once (two binary trees, each rank a
                                                       leaf in one): every rank sends ~N up and ~N down
shm        2                   3                       two barriers; each rank copies N in, adds its
                                                       n chunks of N/n, copies N out (β: memory)
=========  ==================  ======================  =============================================

The unpipelined tree's bandwidth term grows with ``log2 n`` (16x the tensor at 256 ranks, 8x the ring's); the
pipelined tree keeps the tree's short latency and moves about what the ring moves, which is why NCCL uses it
across nodes for small and mid-size messages. It has no row in ``ALGORITHMS`` (the course does not implement it):
like ``shm``, it is a modelled-only cost here. The ring's bandwidth term, ``2(n-1)/n·N·β``, is the lower bound
for any allreduce, which is why nccl-tests reports **bus bandwidth** ``busbw = algbw · 2(n-1)/n``
(``algbw = N / T``): it is the bandwidth each link actually sustained, comparable across world sizes and with the
hardware's link speed. The model leaves out the time to add the numbers (a third term, γ per byte, small on
GPUs) and contention between links that share hardware (large for CPU processes sharing two cores). The times
it is fitted to and checked against are measured by :mod:`course.collectives.timing_ranks`; everything here is
arithmetic on them (no process group).
Taught in ``notebooks/04_allreduce.ipynb``.

**Two levels** (``notebooks/05b_nodes.ipynb``): ``m`` nodes of ``g`` ranks, a fast link inside a node
(``α_in, β_in``) and a slow one between nodes (``α_x, β_x``). A flat ring over all ``n = g·m`` ranks waits for
the slow link at every one of its ``2(n-1)`` steps: ``2(n-1)·α_x + 2(n-1)/n·N·β_x``. The hierarchical
allreduce (``course.collectives.hierarchical``) costs (:func:`hierarchical_coefficients`,
:func:`predict_hierarchical`)::

    T = 4·α_in + 5·N·β_in   +   a(m)·α_x + b(m)·N·β_x
        shared-memory reduce     the allreduce among the m leaders (ring: 2(m-1), 2(m-1)/m)
        and broadcast

(reduce: 2 barriers, copy in, add, the leader copies out; broadcast: 2 barriers, the leader copies in, the
others copy out), with no intra-node term when ``g = 1``. Across nodes it sends ``2(m-1)/m·N`` instead of
``2(n-1)/n·N`` per link, in ``2(m-1)`` steps instead of ``2(n-1)``. The same formula with ``within="ring"`` is
NCCL's two-level allreduce, which the performance model uses (:mod:`course.perf.comm`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from course.arguments import check_count
from course.collectives.allreduce import ALGORITHMS
from course.collectives.timing_ranks import REFERENCE

#: The shared-memory allreduce (``course.collectives.shm_allreduce``): not in ``ALGORITHMS``, it runs in one host.
SHM = "shm"
#: NCCL's pipelined tree: modelled only (no implementation in ``ALGORITHMS``), used by :mod:`course.perf.comm`.
PIPELINED_TREE = "pipelined_tree"

if TYPE_CHECKING:  # matplotlib is imported only when plotting
    from matplotlib.figure import Figure

@dataclass(frozen=True)
class AlphaBeta:
    """A link in the alpha-beta model.

    Attributes:
        alpha_s: latency per message, in seconds.
        beta_s_per_byte: time per byte, in seconds (1 / bandwidth).
    """

    alpha_s: float
    beta_s_per_byte: float

    @property
    def bandwidth(self) -> float:
        """Link bandwidth in bytes per second."""
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    def __str__(self) -> str:
        """A fit that found no latency or no per-byte cost says so, instead of "α = 0.0 µs" or "1/β = inf GB/s"."""
        alpha = f"α = {self.alpha_s * 1e6:.1f} µs" if self.alpha_s >= 0.05e-6 else "α too small to measure here"
        bandwidth = (f"1/β = {self.bandwidth / 1e9:.2f} GB/s" if self.bandwidth < 1e15 else
                     "β too small to measure here")
        return f"{alpha}, {bandwidth}"


def coefficients(algorithm: str, world_size: int) -> tuple[float, float]:
    """``(a, b)`` such that the algorithm costs ``a·α + b·N·β`` on ``world_size`` ranks (module table): an
    algorithm of ``ALGORITHMS``, ``"shm"`` (the shared-memory allreduce, which runs inside one host only) or
    ``"pipelined_tree"`` (NCCL's tree, modelled only).

    Raises:
        ValueError: unknown algorithm or world size below 1.
    """
    n = check_count("world_size", world_size, unit="number of ranks")
    if algorithm == SHM:
        return (2.0, 3.0) if n > 1 else (0.0, 0.0)
    if algorithm == PIPELINED_TREE:
        depth = math.ceil(math.log2(n)) if n > 1 else 0
        return float(2 * depth), float(min(2, n - 1))
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted([*ALGORITHMS, SHM, PIPELINED_TREE])}, got {algorithm!r}.")
    a, b = ALGORITHMS[algorithm].cost(n)
    return float(a), float(b)


def predict(algorithm: str, nbytes: float | np.ndarray, world_size: int, link: AlphaBeta) -> float | np.ndarray:
    """Modelled seconds for one allreduce of ``nbytes`` bytes: ``a·α + b·nbytes·β``."""
    a, b = coefficients(algorithm, world_size)
    return a * link.alpha_s + b * np.asarray(nbytes, dtype=float) * link.beta_s_per_byte


#: The hierarchical allreduce's intra-node part, (a, b) for g > 1 ranks per node: shared-memory reduce then
#: broadcast (module docstring).
INTRA_NODE = (4.0, 5.0)


def hierarchical_coefficients(ranks_per_node: int, nodes: int, across: str = "ring", within: str = "shm"
                              ) -> tuple[tuple[float, float], tuple[float, float]]:
    """``((a_in, b_in), (a_x, b_x))``: the hierarchical allreduce of ``N`` bytes costs
    ``a_in·α_in + b_in·N·β_in + a_x·α_x + b_x·N·β_x`` (module docstring).

    ``within="shm"``: 05b's shared-memory reduce to a leader and broadcast (:data:`INTRA_NODE`); only the leaders
    cross the network, with the whole tensor. ``within="ring"``: NCCL's way, a reduce-scatter and an all-gather
    inside the node (``2(g-1)`` steps, ``2(g-1)/g`` bytes), and *every* rank allreduces its ``1/g`` shard across
    the nodes over its own share of the network (``b_x`` divided by ``g``; ``β_x`` is then one rank's share).

    Raises:
        ValueError: fewer than 1 rank per node or node, or an unknown ``across``/``within`` algorithm.
    """
    ranks_per_node = check_count("ranks_per_node", ranks_per_node, unit="number of ranks")
    nodes = check_count("nodes", nodes, unit="number of nodes")
    if within not in ("shm", "ring"):
        raise ValueError(f"within must be 'shm' (05b's leader scheme) or 'ring' (NCCL's), got {within!r}.")
    a_x, b_x = coefficients(across, nodes)
    if within == "ring":
        g = ranks_per_node
        return (2.0 * (g - 1), 2.0 * (g - 1) / g), (a_x, b_x / g)
    inside = INTRA_NODE if ranks_per_node > 1 else (0.0, 0.0)
    return inside, (a_x, b_x)


def predict_hierarchical(nbytes: float | np.ndarray, ranks_per_node: int, nodes: int, inside: AlphaBeta,
                         between: AlphaBeta, across: str = "ring", within: str = "shm") -> float | np.ndarray:
    """Modelled seconds for one hierarchical allreduce of ``nbytes`` bytes: fast link ``inside`` a node (for
    shared memory, α is a barrier and β the time to copy a byte), slow link ``between`` nodes (per rank when
    ``within="ring"``: see :func:`hierarchical_coefficients`)."""
    (a_in, b_in), (a_x, b_x) = hierarchical_coefficients(ranks_per_node, nodes, across, within)
    size = np.asarray(nbytes, dtype=float)
    return (a_in * inside.alpha_s + b_in * size * inside.beta_s_per_byte
            + a_x * between.alpha_s + b_x * size * between.beta_s_per_byte)


def predict_flat(nbytes: float | np.ndarray, ranks_per_node: int, nodes: int, between: AlphaBeta,
                 algorithm: str = "ring") -> float | np.ndarray:
    """Modelled seconds for a flat allreduce over every rank when each step waits for the slow link."""
    return predict(algorithm, nbytes, ranks_per_node * nodes, between)


def algbw(nbytes: float | np.ndarray, seconds: float | np.ndarray) -> float | np.ndarray:
    """Algorithm bandwidth as nccl-tests defines it: bytes reduced per second, ``N / T``."""
    return np.asarray(nbytes, dtype=float) / np.asarray(seconds, dtype=float)


def busbw(nbytes: float | np.ndarray, seconds: float | np.ndarray, world_size: int) -> float | np.ndarray:
    """Bus bandwidth as nccl-tests defines it for allreduce: ``algbw · 2(n-1)/n``, the per-link rate."""
    return algbw(nbytes, seconds) * 2 * (world_size - 1) / world_size


def fit(nbytes: Sequence[float], seconds: Sequence[float], a: float = 1.0, b: float = 1.0) -> AlphaBeta:
    """Least-squares α and β from measured times, for ``T = a·α + b·N·β`` (a = b = 1: one message).

    Minimises *relative* error, so 1 KB and 64 MB messages count alike (plain least squares would let
    the largest sizes decide α too). Neither may go negative: if one would, it is 0 and the other refit.

    Args:
        nbytes: message sizes in bytes, at least two distinct.
        seconds: measured time for each size.
        a, b: the algorithm's coefficients (see :func:`coefficients`); ``fit_allreduce`` fills them in.

    Raises:
        ValueError: mismatched lengths, fewer than two distinct sizes, or non-positive times.
    """
    sizes, times = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    if sizes.shape != times.shape or len(np.unique(sizes)) < 2:
        raise ValueError(f"need times for at least two distinct sizes, same count of each; got {len(sizes)} "
                         f"sizes ({len(np.unique(sizes))} distinct) and {len(times)} times.")
    if np.any(times <= 0) or a <= 0 or b <= 0:
        raise ValueError("times and the coefficients a, b must all be positive.")
    design = np.column_stack([np.full_like(sizes, a), b * sizes]) / times[:, None]
    target = np.ones_like(times)
    (alpha, beta), *_ = np.linalg.lstsq(design, target, rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(design[:, 1] @ target / (design[:, 1] @ design[:, 1]))
    elif beta < 0:
        alpha, beta = float(design[:, 0] @ target / (design[:, 0] @ design[:, 0])), 0.0
    return AlphaBeta(float(alpha), float(beta))


def fit_allreduce(algorithm: str, world_size: int, nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """The link α, β that best explain one algorithm's measured allreduce times (see :func:`fit`)."""
    a, b = coefficients(algorithm, world_size)
    if a == 0:
        raise ValueError("a world of one rank sends no messages: there is nothing to fit.")
    return fit(nbytes, seconds, a, b)


def crossover(small: str, large: str, world_size: int, link: AlphaBeta) -> float | None:
    """Message size (bytes) above which ``large`` is faster than ``small``: where their costs are equal.

    ``a₁α + b₁Nβ = a₂α + b₂Nβ``  gives  ``N* = (a₂ - a₁)·α / ((b₁ - b₂)·β)``.

    Returns:
        ``N*``, or None if the two never swap places at a positive size (one is faster everywhere).
    """
    a1, b1 = coefficients(small, world_size)
    a2, b2 = coefficients(large, world_size)
    latency_gap, bandwidth_gap = (a2 - a1) * link.alpha_s, (b1 - b2) * link.beta_s_per_byte
    if latency_gap <= 0 or bandwidth_gap <= 0:
        return None
    return latency_gap / bandwidth_gap


def model_error(link: AlphaBeta, world_size: int, measured: Mapping[str, Mapping[int, float]]
                ) -> dict[str, dict[int, float]]:
    """Measured time over modelled time, per algorithm and size (1.0: the model is exact; 4.0: 4x too fast).

    Args:
        measured: ``{algorithm: {nbytes: seconds}}``; names that are not in ``ALGORITHMS`` are skipped.
    """
    return {name: {size: seconds / float(predict(name, size, world_size, link)) for size, seconds in times.items()}
            for name, times in measured.items() if name in ALGORITHMS}


def describe_fit(ratios: Mapping[str, Mapping[int, float]], tolerance: float = 0.2) -> str:
    """One sentence on :func:`model_error`'s ratios: within ``tolerance`` everywhere, or how far off, which way.

    Raises:
        ValueError: no ratios.
    """
    values = [r for by_size in ratios.values() for r in by_size.values()]
    if not values:
        raise ValueError("no measured/modelled ratios to describe: pass model_error(...)'s result.")
    low, high = min(values), max(values)
    if 1 - tolerance <= low and high <= 1 + tolerance:
        return f"the model is within {tolerance:.0%} of every measurement (measured/model {low:.2f}-{high:.2f})"
    if low > 1:
        return f"the model underpredicts every measurement, by {low:.1f}x to {high:.1f}x: it does NOT fit here"
    if high < 1:
        return f"the model overpredicts every measurement (measured/model {low:.2f}-{high:.2f}): it does NOT fit here"
    return f"measured/model ranges from {low:.2f} to {high:.2f}: the model does NOT fit here"


def plot(world_size: int, link: AlphaBeta, measured: dict[str, dict[int, float]] | None = None,
         nbytes: Sequence[float] | None = None, title: str = "") -> Figure:
    """Predicted time per algorithm against size (lines), and measured times (dots) when given.

    Args:
        world_size: ranks in the model. link: α, β to predict with.
        measured: ``{algorithm: {nbytes: seconds}}``, or ``{algorithm: {nbytes: Estimate}}`` (median and 95%
            interval, :func:`course.timing.summarize`: drawn as error bars), or None.
        nbytes: sizes to draw the lines over (default: the measured sizes, else 1 KB to 1 GB).
    """
    import matplotlib.pyplot as plt

    if nbytes is None:
        nbytes = sorted(next(iter(measured.values()))) if measured else np.logspace(3, 9, 50)
    sizes = np.logspace(np.log10(min(nbytes)), np.log10(max(nbytes)), 50)
    fig, ax = plt.subplots(figsize=(8.5, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, name in enumerate(ALGORITHMS):
        color = colors[index % len(colors)]
        ax.plot(sizes, predict(name, sizes, world_size, link), color=color, label=f"{name} (model)")
        if measured and name in measured:
            _measured_points(ax, measured[name], "o", color, f"{name} (measured)")
    if measured and REFERENCE in measured:
        _measured_points(ax, measured[REFERENCE], "^", "k", f"{REFERENCE} (measured)")
    ax.set(xscale="log", yscale="log", xlabel="tensor size (bytes)", ylabel="seconds per allreduce")
    fig.suptitle(title or f"allreduce on {world_size} ranks; model: {link}", fontsize=10)  # over axes and legend
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: over no point
    fig.tight_layout()
    return fig


def _measured_points(ax: object, points: dict[int, object], marker: str, color: str, label: str) -> None:
    """Measured times as dots, with their 95% interval as error bars when they carry one (``.low``, ``.high``)."""
    sizes = sorted(points)
    median = np.array([getattr(points[n], "median", points[n]) for n in sizes], dtype=float)
    if all(hasattr(points[n], "low") for n in sizes):
        spread = np.array([[median[i] - points[n].low, points[n].high - median[i]] for i, n in enumerate(sizes)]).T
        ax.errorbar(sizes, median, yerr=spread, fmt=marker, color=color, capsize=3, label=label)
    else:
        ax.plot(sizes, median, marker, color=color, label=label)
