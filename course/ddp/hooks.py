"""DDP comm hooks that cannot deadlock when the model is torn down.

Why hooks need care (torch 2.13 on gloo; both seen with gdb in this course's test suite): gloo runs each
collective on a worker thread, which frees the collective's work object when it is done with it. A work holds
Python objects: a ``.then(python_callback)`` on its future (torch's own ``default_hooks.allreduce_hook`` and
``fp16_compress_hook``), and, for any collective started during ``backward()``, the thread-local Python context
that autograd stashes for the duration of backward. Freeing those needs the GIL. If the worker frees the last
reference just as the main thread, holding the GIL, destroys the process group (which joins that worker), both
wait for ever.

So the hooks here attach no Python callback, wait for their allreduce inside the hook and return a future that
is already complete (:func:`allreduce_now`), and keep the work object alive on the Python side
(:data:`_FINISHED`), so the worker never holds its last reference; :func:`compress_fp16` is DDP's built-in C++
hook. Collectives that DDP issues itself get the same protection from :func:`course.world.settle` before a
group is destroyed. The price of waiting inside a hook is overlap, which these hooks do not need: they are
references and counters for the checks in :mod:`course.ddp.internals` (notebook 05); DDP without a hook overlaps as
usual.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course.arguments import check_choice

#: How a bucket's gradients are combined across ranks.
OPS = ("avg", "sum")

#: The latest finished works, kept so that gloo's worker thread never frees the last reference (see above); an
#: old one is dropped only after this many newer collectives, long after its worker let go of it.
_FINISHED: deque[dist.Work] = deque(maxlen=256)


def allreduce_now(bucket: dist.GradBucket, op: str = "avg") -> torch.futures.Future:
    """All-reduce ``bucket``'s flat gradient buffer now and return a future that is already complete.

    ``op="avg"`` divides by the world size first (as DDP does), ``"sum"`` leaves the sum.

    Raises:
        ValueError: ``op`` is not one of :data:`OPS`.
    """
    check_choice("op", op, OPS)
    buffer = bucket.buffer()
    if op == "avg":
        buffer.div_(dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)
    work.wait()
    _FINISHED.append(work)
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(buffer)
    return done


def summing(state, bucket):  # no annotations: DDP checks a hook's signature and `from __future__` makes them strings
    """A DDP comm hook that sums gradients instead of averaging them."""
    return allreduce_now(bucket, "sum")


def counting(count: Callable[[int], None], op: str = "avg") -> Callable:
    """A DDP comm hook that calls ``count(bucket_index)`` for each allreduce DDP issues, then all-reduces it."""
    check_choice("op", op, OPS)

    def hook(state, bucket):
        count(bucket.index())
        return allreduce_now(bucket, op)
    return hook


def compress_fp16(model: DistributedDataParallel) -> None:
    """Make ``model`` all-reduce its gradients in float16 (DDP's built-in C++ hook: divide, round, sum, widen)."""
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
