"""Notebook 05b's questions: what the hierarchical allreduce sends across the slow cable."""

from __future__ import annotations

from typing import Any

from course.collectives import cost_model


def cable_steps(ranks_per_node: int = 2, node_count: int = 2) -> dict[str, Any]:
    """Steps of the hierarchical allreduce that cross the cable between nodes."""
    flat_steps, _ = cost_model.coefficients("ring", ranks_per_node * node_count)
    _, (cross_steps, _) = cost_model.hierarchical_coefficients(ranks_per_node, node_count)
    return dict(
        prompt=(f"The flat ring over all {ranks_per_node * node_count} ranks takes {flat_steps:g} steps, and in every "
                "one a chunk crosses the slow cable. The hierarchical allreduce first reduces each node into its "
                "leader through shared memory; only the leaders talk across the cable, as a ring of their own. How "
                "many steps cross the cable?"),
        answer=cross_steps, rel_tol=0.0, unit="steps",
        explanation=(f"2(m-1) = {cross_steps:g} for m = {node_count} leaders, against 2(n-1) = {flat_steps:g} for the "
                     f"flat ring over n = {ranks_per_node * node_count} ranks: every step pays the cable's latency "
                     "α."))


def cable_bytes(tensor_mb: float = 2, ranks_per_node: int = 2, node_count: int = 2) -> dict[str, Any]:
    """MB each leader sends across the cable for a ``tensor_mb`` MB tensor."""
    flat_steps, flat_bytes = cost_model.coefficients("ring", ranks_per_node * node_count)
    inside, (_, cross_bytes) = cost_model.hierarchical_coefficients(ranks_per_node, node_count)
    return dict(
        prompt=(f"For a {tensor_mb:g} MB tensor, how many MB does each leader send across the cable in the "
                "hierarchical allreduce?"),
        answer=cross_bytes * tensor_mb, rel_tol=0.01, unit="MB",
        explanation=(f"2(m-1)/m x N = {cross_bytes:g} x {tensor_mb:g} MB with m = {node_count}: each leader sends its "
                     "half in the reduce-scatter step and its reduced half back in the all-gather step. The flat ring "
                     f"has every rank send 2(n-1)/n x N = {flat_bytes * tensor_mb:g} MB, in {flat_steps:g} steps that "
                     f"each wait for the cable. The hierarchical one pays for it inside the node: {inside[1]:g} x N of "
                     "shared-memory copies."))
