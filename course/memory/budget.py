"""What one device holds while training: a memory budget, and why data parallelism leads to ZeRO and FSDP.

Training state comes in four parts. Three are *model states*, proportional to the parameter count Ψ:
parameters, gradients and optimizer state (momentum: one more tensor per parameter; Adam: two). The fourth,
*activations*, is what the forward pass saves for backward, proportional to the batch size. Data parallelism
(DDP) replicates all model states on every rank. ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", https://arxiv.org/abs/1910.02054, section 5 and Figure 1) partitions
them across the N data-parallel ranks instead: stage 1 the optimizer state, stage 2 also the gradients, stage 3
also the parameters. FSDP (PyTorch's ``fully_shard``) is ZeRO stage 3.

Mixed precision follows the paper's accounting: 16-bit parameters and gradients (2 + 2 bytes) and an fp32
master copy of the parameters inside the optimizer (4 bytes) beside its fp32 state, so mixed-precision Adam
costs 2 + 2 + 12 = 16 bytes per parameter ("K = 12"). Every estimate here has a measured counterpart in
:mod:`course.memory.measure` (bytes of real tensors) and in ``tests/memory/test_budget.py``. Taught in
``notebooks/07_memory.ipynb``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from course.arguments import check_count

#: bytes of one element at each precision the budget knows
PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: fp32 tensors the optimizer keeps per parameter (SGD: none; momentum: the velocity; Adam: first and second moment)
STATE_TENSORS = {"sgd": 0, "momentum": 1, "adam": 2}
#: PyTorch's Adam also keeps a 0-d fp32 ``step`` counter per parameter *tensor* (not per element); the paper omits it
STEP_COUNTER_BYTES = {"sgd": 0, "momentum": 0, "adam": 4}
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Setup:
    """How one model is trained, as far as memory is concerned."""

    optimizer: str = "adam"  # "sgd", "momentum" or "adam"
    precision: str = "fp32"  # "fp32"; or "fp16"/"bf16": 16-bit params, grads, activations + fp32 master weights
    zero_stage: int = 0  # 0: DDP, all replicated; 1: optimizer state sharded; 2: + gradients; 3: + parameters (FSDP)
    world_size: int = 1  # N_d, the data-parallel ranks the model states are sharded over (stages 1-3)
    checkpointing: bool = False  # activation checkpointing: keep segment inputs, recompute the rest in backward

    def __post_init__(self) -> None:
        _check("optimizer", self.optimizer, STATE_TENSORS)
        _check("precision", self.precision, PRECISION_BYTES)
        _check("zero_stage", self.zero_stage, ZERO_STAGES)
        check_count("world_size", self.world_size, unit="number of ranks")

    @property
    def mixed(self) -> bool:
        """True for fp16/bf16 training with fp32 master weights."""
        return self.precision != "fp32"


@dataclass(frozen=True)
class Budget:
    """Bytes one device holds, by kind. ``total`` is what must fit in the GPU's memory."""

    parameters: float  # the model's weights (16-bit in mixed precision), this rank's share
    gradients: float  # one gradient per parameter, same precision as the parameters, this rank's share
    optimizer_state: float  # fp32 momentum/moments, plus the fp32 master weights in mixed precision, this rank's share
    activations: float = 0.0  # tensors saved for backward, for this rank's per-rank batch

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> float:
        return self.model_states + self.activations


def _check(name: str, value: object, allowed: Collection[object]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}.")


def bytes_per_parameter(setup: Setup) -> Budget:
    """Unsharded bytes per parameter: (params, grads, optimizer state), the paper's (2, 2, K) in mixed precision.

    fp32: 4 + 4 + 4 x (state tensors). Mixed: 2 + 2 + 4 x (1 master copy + state tensors); for Adam 2 + 2 + 12,
    the 16 bytes per parameter of ZeRO section 3.1.
    """
    width = PRECISION_BYTES[setup.precision]
    state = 4 * (STATE_TENSORS[setup.optimizer] + setup.mixed)
    return Budget(width, width, state)


def model_states(num_params: float, setup: Setup, num_tensors: int = 0) -> Budget:
    """Bytes of parameters, gradients and optimizer state on one rank, ZeRO stage ``setup.zero_stage``.

    Stage 0 (DDP) keeps everything on every rank: (2 + 2 + K)Ψ in mixed precision. Stage 1 (P_os) divides the
    optimizer state by N: 2Ψ + 2Ψ + KΨ/N; stage 2 (P_os+g) also the gradients: 2Ψ + (2 + K)Ψ/N; stage 3
    (P_os+g+p, FSDP) everything: (2 + 2 + K)Ψ/N (ZeRO paper, Figure 1: 7.5 B parameters on 64 GPUs take
    120, 31.4, 16.6 and 1.9 GB). The ideal even split; real sharders round to whole tensors or rows.

    Args:
        num_params: Ψ, trainable parameters of the whole model.
        setup: optimizer, precision, stage and world size.
        num_tensors: parameter tensors, for PyTorch Adam's per-tensor ``step`` counters (0 to leave them out,
            as the paper does).
    """
    unit = bytes_per_parameter(setup)
    shards = [setup.world_size if setup.zero_stage >= stage else 1 for stage in (3, 2, 1)]
    counters = STEP_COUNTER_BYTES[setup.optimizer] * num_tensors
    return Budget(unit.parameters * num_params / shards[0], unit.gradients * num_params / shards[1],
                  (unit.optimizer_state * num_params + counters) / shards[2])


def largest_model(memory_bytes: float, setup: Setup) -> float:
    """The most parameters whose model states fit in ``memory_bytes`` per rank (activations not counted)."""
    return memory_bytes / model_states(1.0, setup).model_states


def checkpointed(layer_bytes: list[float], input_bytes: list[float], segments: int) -> float:
    """Activation bytes held with checkpointing: every segment's input, plus one segment recomputed in backward.

    The layers are cut into ``segments`` runs of consecutive layers (as ``torch.utils.checkpoint.checkpoint_sequential``
    does); forward keeps only each segment's input, backward recomputes one segment at a time and holds its
    saved tensors while it runs. With ``segments`` near sqrt(layers) this is O(sqrt(layers)) (Chen et al. 2016,
    https://arxiv.org/abs/1604.06174).

    Args:
        layer_bytes: bytes each layer saves for backward, in forward order.
        input_bytes: bytes of each layer's input, same order.
        segments: number of checkpointed segments, 1..len(layer_bytes).
    """
    if len(layer_bytes) != len(input_bytes) or not 1 <= segments <= len(layer_bytes):
        raise ValueError(f"need as many input sizes as layers ({len(layer_bytes)} vs {len(input_bytes)}) and "
                         f"1 <= segments <= layers, got segments={segments}.")
    size = -(-len(layer_bytes) // segments)
    starts = range(0, len(layer_bytes), size)
    return sum(input_bytes[s] for s in starts) + max(sum(layer_bytes[s:s + size]) for s in starts)


def budget(num_params: float, activation_bytes_per_sample: float, batch_size: int, setup: Setup,
           checkpointed_fraction: float = 1.0) -> Budget:
    """One rank's whole budget: model states plus activations for ``batch_size`` samples (per rank).

    ``activation_bytes_per_sample`` is at fp32; 16-bit training halves it. ``checkpointed_fraction`` is the
    share of activations kept when ``setup.checkpointing`` (from :func:`checkpointed` over the full figure).
    """
    states = model_states(num_params, setup)
    scale = PRECISION_BYTES[setup.precision] / 4 * (checkpointed_fraction if setup.checkpointing else 1.0)
    return Budget(states.parameters, states.gradients, states.optimizer_state,
                  activation_bytes_per_sample * batch_size * scale)


def largest_batch(memory_bytes: float, num_params: float, activation_bytes_per_sample: float, setup: Setup,
                  checkpointed_fraction: float = 1.0) -> int:
    """The largest per-rank batch whose budget fits in ``memory_bytes`` (0 if the model states alone do not)."""
    free = memory_bytes - model_states(num_params, setup).model_states
    per_sample = budget(0, activation_bytes_per_sample, 1, setup, checkpointed_fraction).activations
    return max(0, int(free // per_sample))
