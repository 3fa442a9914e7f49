"""Notebook 04's questions: the ring's bytes per rank, and the fastest algorithm for 100 MB (modelled)."""

from __future__ import annotations

from typing import Any

from course.collectives import allreduce, cost_model
from course.perf import catalog
from course.perf import model as perf_model


def ring_bytes(world_size: int = 4) -> dict[str, Any]:
    """Bytes each rank sends in a ring allreduce, as a multiple of the tensor."""
    steps, sent = cost_model.coefficients("ring", world_size)
    return dict(
        prompt=(f"A ring allreduce of a tensor of G bytes on {world_size} ranks: how many bytes does each rank send, "
                "as a multiple of G (1 = the whole tensor once)?"),
        answer=sent, rel_tol=0.01,
        explanation=(f"2(n-1)/n = {sent:g}: {int(steps)} steps (n-1 of reduce-scatter, n-1 of all-gather), each "
                     f"sending one chunk of G/n. So for G = 100 MB each rank sends {sent * 100:g} MB, and that "
                     "barely grows with n, while the naive algorithm's rank 0 sends n-1 whole tensors."))


def fastest_100mb() -> dict[str, Any]:
    """MODELLED: the fastest algorithm for 100 MB on 8 GPUs over PCIe 4.0."""
    pcie = perf_model.alpha_beta(catalog.link("PCIe 4.0 x16"), perf_model.Assumptions())
    modelled_ms = {name: cost_model.predict(name, 100e6, 8, pcie) * 1e3 for name in allreduce.ALGORITHMS}
    fastest = min(modelled_ms, key=modelled_ms.get)
    return dict(
        prompt=("MODELLED for real GPUs: 100 MB of gradients all-reduced on 8 GPUs joined by PCIe 4.0. Which "
                "algorithm is fastest?"),
        answer=fastest, choices=tuple(allreduce.ALGORITHMS),
        explanation=(f"{fastest}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in modelled_ms.items())
                     + " in the alpha-beta model. At 100 MB the bandwidth term N·β dominates, and the ring sends "
                     "2(n-1)/n of the tensor per rank where the tree and the naive algorithm send whole tensors."))
