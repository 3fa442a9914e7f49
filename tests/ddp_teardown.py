"""Build and tear down DDP models with a comm hook, many times, in the order that deadlocked (a fresh process).

Each round makes a one-rank gloo group (``groups.single_rank_group``, as the tests do), wraps a model in DDP
with the hook named on the command line, runs two backward passes, destroys the group while the model is still
alive, and lets the model die afterwards. Without :func:`course.world.settle` before the group is destroyed, or
with a hook whose future carries a Python callback (torch's ``default_hooks.allreduce_hook``: pass
``python-then``), that teardown can hang for ever holding the GIL (see :mod:`course.ddp.hooks`). faulthandler's
watchdog, a C thread that needs no GIL, prints every thread's stack and exits 1 if the rounds are not done in
time.

    python tests/ddp_teardown.py HOOK[,HOOK...] ROUNDS SECONDS
"""

from __future__ import annotations

import faulthandler
import sys

import torch
import torch.distributed as dist
from groups import single_rank_group
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from course.ddp import hooks as ddp_hooks
from course.models import DigitsCNN

HOOKS = {
    "none": lambda model: None,
    "counting": lambda model: model.register_comm_hook(None, ddp_hooks.counting(lambda index: None)),
    "summing": lambda model: model.register_comm_hook(None, ddp_hooks.summing),
    "fp16": ddp_hooks.compress_fp16,
    # the pattern that deadlocks (a Python `.then` callback on gloo's future): never used by the course
    "python-then": lambda model: model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook),
}


def one_round(hook: str, bucket_cap_mb: float) -> None:
    with single_rank_group():
        model = DistributedDataParallel(DigitsCNN(width=4), bucket_cap_mb=bucket_cap_mb)
        HOOKS[hook](model)
        for _ in range(2):  # DDP rebuilds its buckets after the first iteration
            model(torch.randn(4, 1, 8, 8)).sum().backward()
    # the group is destroyed while `model` is alive; the model dies when this function returns


def main(hooks: str, rounds: int, seconds: float) -> None:
    """``rounds`` rounds with each hook of the comma-separated ``hooks``, one hook after the other."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    torch.set_num_threads(1)
    for hook in hooks.split(","):
        for index in range(rounds):
            one_round(hook, (25.0, 0.1, 0.01)[index % 3])
        print(f"{rounds} rounds of {hook}: done", flush=True)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
