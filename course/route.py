"""The course map: which notebooks make the core path, which are optional, and where the assignment sits.

One table for notebooks 00 and 10 and the README's map: :data:`UNITS` lists every notebook with its part of the
route (``tests/test_route.py`` checks that every notebook is on it, and that the README agrees). :func:`lines`
prints it; :data:`REAL_JOBS` says which tool of a real training job each unit's idea becomes (notebook 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

#: The parts of the route, in the order a learner meets them.
PARTS = {
    "core": "core path: do these in order",
    "optional": "optional: take any, any time after the notebooks they need",
    "capstone": "the core path's capstone: your own 4-GPU training script, self-checked",
    "beyond": "beyond data parallelism: optional, each after the notebooks it needs",
    "closing": "closing: what you learned and where to go next",
}


@dataclass(frozen=True)
class Unit:
    """One notebook on the route: its number (file prefix), what it teaches, its part, the units it needs."""

    number: str
    topic: str
    part: str
    needs: tuple[str, ...] = ()

    def present(self) -> bool:
        """True when the notebook exists in this copy of the course (a unit may be on its way)."""
        return any(NOTEBOOKS.glob(f"{self.number}_*.ipynb"))


UNITS = (
    Unit("00", "your environment, ranks, a 4-rank hello world", "core"),
    Unit("01", "gradient descent against SGD; what a bigger batch buys", "core", ("00",)),
    Unit("02", "large batches: noise scale, learning-rate scaling, warmup", "core", ("01",)),
    Unit("03", "multi-GPU by hand: data parallelism, a parameter server, the pipeline bubble", "core", ("02",)),
    Unit("04", "all-reduce: naive, ring and tree, and their cost model", "core", ("03",)),
    Unit("04b", "a Horovod-style distributed optimizer: hooks, buckets, overlap", "core", ("04",)),
    Unit("05", "a single-GPU script to DDP with torchrun; its accuracy; scaling", "core", ("04b",)),
    Unit("05b", "two nodes on one machine; the hierarchical all-reduce", "optional", ("05",)),
    Unit("05c", "a performance model: the roofline, overlap, a strategy planner", "optional", ("05",)),
    Unit("06", "the assignment: your own 4-GPU training script", "capstone", ("05",)),
    Unit("07", "memory: what one GPU holds; ZeRO and FSDP", "beyond", ("00",)),
    Unit("08", "tensor, sequence and pipeline parallelism of a transformer", "beyond", ("04", "05")),
    Unit("08b", "long context and mixture of experts", "beyond", ("08",)),
    Unit("09", "mixed precision, checkpoints and restarts, debugging drills", "beyond", ("05",)),
    Unit("09b", "profiling a DDP step, and the common pitfalls", "beyond", ("05",)),
    Unit("10", "what you learned, and where to go next", "closing"),
)

#: What each idea becomes in a real training job: (the idea, where the course teaches it, the tool that does it).
REAL_JOBS = (
    ("start one process per GPU, on one node or many", "05, 05b", "torchrun (torch.distributed.run)"),
    ("average gradients, overlapped with backward", "04, 04b, 05", "DistributedDataParallel (DDP)"),
    ("shard optimizer state, gradients and parameters", "07", "FSDP (fully_shard), DeepSpeed ZeRO"),
    ("split layers across GPUs: tensor, sequence, pipeline", "08", "Megatron-LM, torch.distributed.tensor"),
    ("split long sequences over GPUs; route tokens to experts", "08b",
     "context parallelism in torchtitan and Megatron-LM; expert parallelism in Megatron-LM and DeepSpeed-MoE"),
    ("compose all of them for a large model", "05c, 07, 08", "torchtitan, Megatron-LM, DeepSpeed"),
    ("mixed precision, checkpoints, restarts", "09", "torch.autocast, torch.distributed.checkpoint"),
    ("find where a step's time goes", "09b", "torch.profiler, NCCL's flight recorder"),
)


def lines() -> list[str]:
    """The route as text: one line per notebook, grouped by part, each with what it needs."""
    out = []
    for part, meaning in PARTS.items():
        out.append(f"{meaning}:")
        for unit in (u for u in UNITS if u.part == part):
            needs = f" (after {', '.join(unit.needs)})" if unit.needs and part != "core" else ""
            coming = "" if unit.present() else " [coming soon]"
            out.append(f"  {unit.number:>4}  {unit.topic}{needs}{coming}")
    return out
