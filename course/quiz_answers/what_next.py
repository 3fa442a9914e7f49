"""Notebook 10's questions: a two-node job's world size, and the least sharding that fits a 13B model."""

from __future__ import annotations

from typing import Any

from course.memory import budget as mb
from course.memory import fit as memory_fit

#: The ZeRO stages by the names the question gives them.
STAGES = ("DDP (nothing sharded)", "ZeRO-1 (optimizer state)", "ZeRO-2 (+ gradients)", "FSDP (+ parameters)")


def real_world_size(nnodes: int = 2, nproc_per_node: int = 8) -> dict[str, Any]:
    """The world size of ``torchrun --nnodes=N --nproc_per_node=P`` on every node."""
    return dict(
        prompt=(f"A real job: the same torchrun command with --nnodes={nnodes} --nproc_per_node={nproc_per_node} "
                f"runs on each of {nnodes} servers. What world size does every rank see?"),
        answer=nnodes * nproc_per_node, rel_tol=0.0, unit="ranks",
        explanation=(f"{nnodes} x {nproc_per_node}: one rank per GPU on every node, and one world across the "
                     "nodes. The rendezvous numbers the nodes; each rank gets its RANK, LOCAL_RANK and WORLD_SIZE "
                     "from torchrun, as in notebook 05."))


def least_sharding(params: float = 13e9, gpus: int = 8, gpu_name: str = "A100 SXM4 80GB") -> dict[str, Any]:
    """The first ZeRO stage whose mixed-precision Adam model states fit each GPU (activations aside)."""
    memory = memory_fit.GPU_MEMORY[gpu_name]
    per_gpu = [mb.model_states(params, mb.Setup("adam", "bf16", zero_stage=stage, world_size=gpus)).model_states
               for stage in range(4)]
    fits = next((stage for stage, need in enumerate(per_gpu) if need <= memory), 3)
    return dict(
        prompt=(f"A {params / 1e9:g}B-parameter model, mixed-precision Adam, on {gpus} GPUs of {memory / 1e9:g} GB. "
                "Leaving activations aside, what is the least sharding whose model states fit each GPU?"),
        answer=STAGES[fits], choices=STAGES,
        explanation=(", ".join(f"{name.split(' (')[0]} {need / 1e9:.0f} GB" for name, need in
                               zip(STAGES, per_gpu, strict=True))
                     + f" per GPU against {memory / 1e9:g} GB. Sharding Adam's 12 bytes per parameter already "
                     "fits; activations and temporary buffers come on top, which is why real jobs often go further."))
