"""One tensor in, one tensor out: the all-gather and reduce-scatter under the name the installed torch gives them.

torch 2.13 calls them ``dist.all_gather_single`` and ``dist.reduce_scatter_single``; older torch (the 2.11 of some
GPU images) calls them ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, names 2.13 deprecates with a
``FutureWarning``. The course's code calls :func:`all_gather_single` and :func:`reduce_scatter_single` here, which
pick the new name where torch has it. The name is looked up at each call, so whatever wraps ``torch.distributed``
(the communication log, the grader's recorders) sees the call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

#: new name -> the name older torch gives the same collective
OLDER = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}


def named(new: str) -> str:
    """``new`` if the installed ``torch.distributed`` has it, else its older name (:data:`OLDER`)."""
    if new not in OLDER:
        raise ValueError(f"expected one of {sorted(OLDER)}, got {new!r}")
    return new if hasattr(dist, new) else OLDER[new]


def all_gather_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> Any:  # noqa: A002 - torch's name
    """Every rank's ``input``, concatenated in rank order along dim 0 into ``output`` (``group``, ``async_op``: as
    torch's)."""
    return getattr(dist, named("all_gather_single"))(output, input, **kwargs)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> Any:  # noqa: A002
    """``input`` summed over the ranks (or ``op``), split along dim 0; this rank's piece lands in ``output``."""
    return getattr(dist, named("reduce_scatter_single"))(output, input, **kwargs)
