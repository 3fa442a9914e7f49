"""Notebook 09b's questions: allreduces in a trace, whom a stuck loader's hang blames, seeds, compiled graphs."""

from __future__ import annotations

from typing import Any

from course.practice import pitfalls as pitfall_runs


def allreduces() -> dict[str, Any]:
    """How many gloo:all_reduce events one rank's trace of one DDP step holds."""
    return dict(
        prompt=("The model's gradients fill several DDP buckets. How many gloo:all_reduce events will one rank's "
                "trace of one step hold?"),
        choices=("one per parameter tensor", "one per bucket", "one for the whole step"), answer="one per bucket",
        explanation=("DDP copies gradients into buckets as backward produces them and starts one allreduce per "
                     "bucket as soon as the bucket is full; that is what lets communication overlap the rest of "
                     "backward."))


def stuck_loader() -> dict[str, Any]:
    """Which rank a hang report blames when rank 1 is stuck in its DataLoader."""
    return dict(
        prompt=("Rank 1 gets stuck loading its next batch while rank 0 waits in all_reduce. Which rank will the hang "
                "report blame?"),
        choices=("rank 0 (in all_reduce)", "rank 1 (in its DataLoader)", "both"), answer="rank 1 (in its DataLoader)",
        explanation=("A rank blocked in a collective is waiting for a peer; the rank elsewhere is the one at fault. "
                     "Its stack then says where it is: here, inside the dataset's __getitem__."))


def pitfalls() -> dict[str, Any]:
    """On what fraction of the steps both ranks draw the same crop when seeded alike."""
    steps = pitfall_runs.augmentation_seeds.__defaults__[0]  # (steps, seed)
    return dict(
        prompt=(f"With the same seed on both ranks, on what fraction of the {steps} steps does rank 1 draw the same "
                "crop as rank 0?"),
        answer=1.0, rel_tol=0.0, unit="(fraction of steps)",
        explanation=("The same generator, seeded alike, draws the same numbers: every crop is duplicated, and the "
                     "global batch holds world_size copies of each augmentation."))


def compiled_graphs() -> dict[str, Any]:
    """How many graphs the compiler receives from DDP(torch.compile(model)) with DDPOptimizer on."""
    return dict(
        prompt=("DDP puts the 6 layers in 6 buckets. How many graphs will the compiler receive from "
                "DDP(torch.compile(model)), with DDPOptimizer on?"),
        answer=6, rel_tol=0.0, unit="graphs",
        explanation=("One subgraph per bucket: each bucket's gradients then come out of their own backward node, so "
                     "its allreduce can start while the earlier layers' backward still runs."))
