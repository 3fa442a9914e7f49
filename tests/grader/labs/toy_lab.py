"""A toy lab for the driver's tests: the student writes ``double(tensor)``; rank 1 checks its own result."""

from __future__ import annotations

import torch
import torch.distributed as dist

from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry


def check_on_rank(path: str, config: dict) -> RankFindings:
    double = load_entry(path, "double")
    rank = dist.get_rank()
    tensor = torch.full((3,), float(rank + config.get("offset", 0)))
    out = double(tensor.clone())
    right = torch.equal(out, 2 * tensor)
    wrong = f"rank {rank} got {out.tolist()}, expected {(2 * tensor).tolist()}"
    found = [Finding("doubles", right, "" if right else wrong),
             Finding("hidden_one", True)]
    return RankFindings(found, {"out": out})


def cross_check(config: dict, evidence: list[dict]) -> list[Finding]:
    """Outside the ranks: every rank's output must be twice its input."""
    offset = config.get("offset", 0)
    wrong = [rank for rank, e in enumerate(evidence)
             if not torch.equal(e["out"], torch.full((3,), 2.0 * (rank + offset)))]
    return [Finding("cross", not wrong, f"outside the ranks, ranks {wrong} are wrong" if wrong else "")]


LAB = Lab(
    name="toy", title="double a tensor", notebook="none", student_file="labs/toy.py", entry="double",
    checks=(Check("doubles", "doubles on every rank", 2), Check("cross", "cross-checked outside", 1),
            Check("hidden_one", "a hidden check", 1, "after_published")),
    rank_check=check_on_rank, cross_check=cross_check,
    runs=({"world_size": 2, "label": "offset 0", "timeout_s": 30},),
    hidden_runs=({"world_size": 2, "label": "offset 5", "offset": 5, "timeout_s": 30},),
    hang_hint="(toy hint)",
)
