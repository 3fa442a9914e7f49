"""Every lab, by name: one row per lab here, one module per lab beside it (each defines ``LAB``).

A row whose module is not there (yet) is skipped, so a lab is added by writing its module and its row.
"""

from __future__ import annotations

import importlib
import importlib.util

from grader.labs.core import Lab

#: lab name -> the module that defines its ``LAB``
MODULES = {
    "ring": "grader.labs.ring",  # notebook 04: ring allreduce from point-to-point
    "ddp": "grader.labs.ddp",  # notebook 04b: DDP by hand (bucketed, overlapped)
    "zero": "grader.labs.zero",  # notebook 07: ZeRO-1 sharded Adam
    "fsdp": "grader.labs.fsdp",  # notebook 07: FSDP (ZeRO-3) by hand
    "tp_mlp": "grader.labs.tp_mlp",  # tensor-parallel MLP
    "one_f_one_b": "grader.labs.one_f_one_b",  # the 1F1B pipeline schedule
    "estimate": "grader.labs.estimate",  # notebook 05c: model states per GPU and TP all-reduce time by hand
    "mixed_precision": "grader.labs.mixed_precision",  # notebook 09: a loss scaler and an AMP training step
    "checkpoint": "grader.labs.checkpoint",  # notebook 09: save and resume bit-for-bit under DDP
    "sequence_parallel": "grader.labs.sequence_parallel",  # notebook 08: the gather linear of sequence parallelism
    "pipeline_runner": "grader.labs.pipeline_runner",  # notebook 08: 1F1B executed with isend/irecv
    "trace_overlap": "grader.labs.trace_overlap",  # notebook 09b: communication overlap read from a trace
    "ring_attention": "grader.labs.ring_attention",  # notebook 08b: causal ring attention over isend/irecv
    "moe_dispatch": "grader.labs.moe_dispatch",  # notebook 08b: expert dispatch and combine with all_to_all_single
}


def _load() -> dict[str, Lab]:
    labs = {}
    for name, module in MODULES.items():
        if importlib.util.find_spec(module) is None:
            continue
        lab = importlib.import_module(module).LAB
        if lab.name != name:
            raise ValueError(f"{module}.LAB is named {lab.name!r} but its row in grader.labs.registry says {name!r}")
        labs[name] = lab
    return labs


LABS: dict[str, Lab] = _load()


def get(name: str) -> Lab:
    """The lab called ``name``; raises ValueError listing the labs if there is none."""
    if name not in LABS:
        raise ValueError(f"no lab called {name!r}; the labs are: {', '.join(LABS) or 'none yet'}")
    return LABS[name]
