"""Notebook 09's questions: what stays fp32 under autocast, the steps a restart trains twice, whom a hang blames."""

from __future__ import annotations

from typing import Any

from course.memory import budget as mb
from course.practice import drills, resume

ZERO_PAPER = "https://arxiv.org/abs/1910.02054"  # Rajbhandari et al. 2020, ZeRO, section 3.1


def autocast_bytes() -> dict[str, Any]:
    """Bytes per parameter of the model states under bf16 autocast with Adam."""
    fp32 = mb.bytes_per_parameter(mb.Setup("adam", "fp32"))
    zero_mixed = mb.bytes_per_parameter(mb.Setup("adam", "bf16"))
    return dict(
        prompt=("Under torch.autocast (bf16) with Adam, how many bytes per parameter do the parameters, their "
                "gradients and Adam's state take on each rank (leave out Adam's per-tensor step counter)?"),
        answer=fp32.model_states, rel_tol=0.0, unit="bytes", source=ZERO_PAPER,
        explanation=(f"autocast casts copies for each matrix product; the parameters stay fp32 ({fp32.parameters:g}), "
                     f"so do their gradients ({fp32.gradients:g}, what DDP all-reduces) and Adam's two moments "
                     f"({fp32.optimizer_state:g}): {fp32.model_states:g}. The ZeRO paper's mixed precision counts "
                     f"{zero_mixed.parameters:g} + {zero_mixed.gradients:g} + {zero_mixed.optimizer_state:g} = "
                     f"{zero_mixed.model_states:g}: 16-bit weights and gradients plus an fp32 master copy. Same "
                     "total, another split."))


def redone_steps(crash_at: int) -> dict[str, Any]:
    """Steps the restarted job trains twice when rank 1 dies at global step ``crash_at``."""
    config = resume.Config()
    per_epoch = config.num_samples // (config.batch_size * 2)
    epoch, restart_step = resume.resume_point(config, crash_at)
    in_epoch = crash_at % per_epoch
    redone = in_epoch - restart_step
    every = config.checkpoint_every
    return dict(
        prompt=(f"{per_epoch} steps per epoch, counted from 0. A checkpoint is saved every {every} steps (after "
                f"steps {every - 1}, {2 * every - 1}, ...) and at each epoch's end. Rank 1 dies at global step "
                f"{crash_at}, before training it. How many steps does the restarted job train twice?"),
        answer=redone, rel_tol=0.0, unit="steps",
        explanation=(f"Global step {crash_at} is epoch {epoch}, step {in_epoch}. Steps 0 to {in_epoch - 1} of that "
                     f"epoch had run. The last checkpoint was saved after step {restart_step - 1}, so the restart "
                     f"begins at step {restart_step}. Steps {restart_step} to {in_epoch - 1} run again: {redone}."))


def hang_blame() -> dict[str, Any]:
    """Which rank a hang report blames when one rank skips an all_reduce."""
    skipper = drills.SKIPPING_RANK
    return dict(
        prompt=(f"Rank {skipper} skips an all_reduce and goes on with its data loading; rank 0 waits in the "
                "all_reduce. After the time limit, which rank should a hang report blame?"),
        choices=("rank 0: it is the one stuck in all_reduce", f"rank {skipper}: it never came",
                 "neither: gloo returns a zero tensor"),
        answer=f"rank {skipper}: it never came",
        explanation=("a rank blocked in a collective is waiting for a peer, not at fault: the launcher asks every "
                     "rank for its Python stack and blames the ranks that were not in a collective."))
