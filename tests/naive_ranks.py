"""Rank functions for the notebook-03 tests: every multi-rank check in ONE 4-rank launch (starting ranks is slow).

``report()`` launches once per test session and caches the per-rank results, so test_data_parallel,
test_parameter_server and test_model_parallel share one launch.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.distributed as dist

from course import data_parallel, world
from course.data_parallel import train_step
from course.model_parallel import two_stage as model_parallel
from course.models import DigitsCNN
from course.naive import parameter_server, who_works
from course.runtime.launch import launch
from course.train import make_optimizer

WORLD_SIZE = 4
PS = parameter_server.Config(steps=4, global_batch_size=24, lr=0.2, width=4, seed=1)
PIPE = model_parallel.Config(batch_size=12, micro_batches=(1, 3, 12), width=4, repeats=1, seed=2)


def _error(fn: Any, *args: Any) -> str:
    """The message of the ValueError that ``fn(*args)`` raises, or '' if it does not raise."""
    try:
        fn(*args)
    except ValueError as error:
        return str(error)
    return ""


def everything(ps_batches: list, pipe_batch: tuple) -> dict[str, Any]:
    """On each of the 4 ranks: allreduce data parallelism and both parameter servers, rank 0 alone, both
    clocked (who_works), the 4-stage pipeline, and the errors for a global batch that does not divide and
    stages that do not match the world size."""
    model = torch.nn.Linear(2, 2)
    x, y = torch.zeros(6, 2), torch.zeros(6, dtype=torch.int64)
    errors = {
        "indivisible": _error(data_parallel.train_on_ranks, model, [(x, y)], 0.1),
        "stages": _error(model_parallel.pipeline_step, [model, model], x, y, 1),
        "micro_batches": _error(model_parallel.pipeline_step, [model] * WORLD_SIZE, x, y, 7),
    }
    dist.barrier()
    torch.manual_seed(PS.seed)
    naive_model = DigitsCNN(width=PS.width).to(world.current().device)
    naive = who_works.train_on_rank0(naive_model, ps_batches, PS.lr)
    torch.manual_seed(PS.seed)
    who = who_works.compare_on_ranks(DigitsCNN(width=PS.width), ps_batches, PS.lr, optimizer="adam",
                                     then=(operator.add, (2, 3)))
    return {"who": who, "ps": parameter_server.compare_on_ranks(PS, ps_batches, async_delay_s=0.003),
            "pipe": model_parallel.run_pipeline(PIPE, pipe_batch), "errors": errors,
            "rank0": {"losses": naive, "params": torch.nn.utils.parameters_to_vector(naive_model.parameters())
                      .detach().cpu()}}


@functools.cache
def one_process(optimizer: str) -> tuple[list[float], torch.Tensor]:
    """The reference the ranks' runs are checked against: one process training :data:`PS`'s model on its global
    batches with ``optimizer`` (``"sgd"`` or ``"adam"``); its losses and final flat parameters."""
    torch.manual_seed(PS.seed)
    model = DigitsCNN(width=PS.width)
    optimizer_ = make_optimizer(optimizer, model.parameters(), PS.lr)
    losses = [train_step([model], [optimizer_], x, y).loss for x, y in parameter_server.batches(PS)]
    return losses, torch.nn.utils.parameters_to_vector(model.parameters()).detach()


@functools.cache
def report() -> list[dict[str, Any]]:
    """Per-rank results of :func:`everything`, launched once."""
    return launch(everything, WORLD_SIZE, parameter_server.batches(PS), model_parallel.training_batch(PIPE),
                  timeout_s=240)
