"""Notebook 07's questions: mixed-precision Adam's bytes per parameter, and the largest model ZeRO-3 fits."""

from __future__ import annotations

from typing import Any

from course.memory import budget as mb
from course.memory import fit as memory_fit

ZERO_PAPER = "https://arxiv.org/abs/1910.02054"  # Rajbhandari et al., ZeRO, section 3.1


def adam_bytes() -> dict[str, Any]:
    """Bytes per parameter of mixed-precision Adam's model states, as the ZeRO paper counts them."""
    mixed, fp32 = mb.bytes_per_parameter(mb.Setup("adam", "fp16")), mb.bytes_per_parameter(mb.Setup("adam"))
    verdict = "does not shrink" if fp32.model_states <= mixed.model_states else "shrinks"
    return dict(
        prompt=("Adam in mixed precision keeps 16-bit parameters and gradients, and in the optimizer an fp32 master "
                "copy of the weights and Adam's two fp32 moments. How many bytes per parameter are the model states?"),
        answer=mixed.model_states, rel_tol=0.0, unit="bytes", source=ZERO_PAPER,
        explanation=(f"{mixed.parameters:g} (fp16 parameter) + {mixed.gradients:g} (fp16 gradient) + "
                     f"{mixed.optimizer_state:g} (fp32 master weight, momentum and variance) = {mixed.model_states:g}, "
                     f"the ZeRO paper's 2 + 2 + K with K = 12. Plain fp32 Adam needs {fp32.parameters:g} + "
                     f"{fp32.gradients:g} + {fp32.optimizer_state:g} = {fp32.model_states:g}: mixed precision "
                     f"{verdict} the model states in this scheme (under torch.autocast the weights and gradients stay "
                     "fp32 and there is no master copy: the fp32 model states); what 16 bits save is activation "
                     "memory."))


def zero3_fit(gpu_name: str = "A100 SXM4 80GB", shards: int = 8) -> dict[str, Any]:
    """The largest model whose model states fit ``shards`` GPUs under ZeRO-3."""
    memory = memory_fit.GPU_MEMORY[gpu_name]
    largest = mb.largest_model(memory, mb.Setup("adam", "fp16", zero_stage=3, world_size=shards))
    replicated = mb.largest_model(memory, mb.Setup("adam", "fp16"))
    return dict(
        prompt=(f"On {shards} {gpu_name} GPUs ({memory / 1e9:g} GB each), ZeRO-3 shards the parameters, gradients and "
                "optimizer state of mixed-precision Adam over all of them. What is the largest model whose model "
                "states fit, in billions of parameters?"),
        answer=largest / 1e9, rel_tol=0.05, unit="billion parameters", source=ZERO_PAPER,
        explanation=(f"{shards} x {memory / 1e9:g} GB / 16 bytes per parameter = {largest / 1e9:g} billion: stage 3 "
                     f"divides everything by the number of GPUs. DDP replicates it all and stops at "
                     f"{replicated / 1e9:g} billion however many GPUs you add; activations come on top."))
