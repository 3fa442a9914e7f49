"""DDP's internals checked numerically: buckets, ``no_sync`` accumulation, batch-norm statistics, sharding.

:func:`bucket_report` says how a model's gradients fill DDP's buckets. The rank functions
(:func:`compare_with_ddp`, :func:`no_sync_check`, :func:`batchnorm_check`) run under
``course.runtime.launch.launch`` and check against ``torch.nn.parallel.DistributedDataParallel``; notebook 05
(``notebooks/05_ddp.ipynb``) shows them, and notebook 04b uses :func:`compare_with_ddp` to show the Horovod-style
optimizer gives DDP's parameters. The DDP script itself, step by step, and torchrun: :mod:`course.ddp.scripts`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import data, exercise, train, world
from course.arguments import check_choice
from course.ddp import hooks as ddp_hooks
from course.ddp.distributed_optimizer import DistributedOptimizer
from course.ddp.horovod import broadcast_parameters
from course.models import DigitsCNN, gradient_bytes

#: torch's dist._DEFAULT_FIRST_BUCKET_BYTES and DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB = 2**20, 25.0


def arrival_order(model: nn.Module, inputs: torch.Tensor) -> list[nn.Parameter]:
    """``model``'s parameters in the order one backward on ``inputs`` makes their gradients final (DDP's order), on a
    copy of the model (``model``'s gradients are left as they were)."""
    copy_ = copy.deepcopy(model)
    order: list[int] = []
    for index, p in enumerate(q for q in copy_.parameters() if q.requires_grad):
        p.register_post_accumulate_grad_hook(lambda _, index=index: order.append(index))
    copy_(inputs).sum().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    return [params[i] for i in order]


def bucket_report(model: nn.Module, bucket_cap_mb: float | None = None, inputs: torch.Tensor | None = None) -> dict:
    """How ``model``'s gradients fill DDP's buckets from its second iteration on, as torch 2.13 builds them.

    DDP's first iteration reduces every gradient in one bucket: it does not know yet in which order they arrive.
    Then it rebuilds its buckets in the order they arrived: observed with ``inputs`` (:func:`arrival_order`), else
    assumed to be the reverse of ``model.parameters()`` (a layer's weight and bias may then swap). Left at its
    default (``bucket_cap_mb=None``: 25 MiB), the first bucket is capped at 1 MiB
    (``dist._DEFAULT_FIRST_BUCKET_BYTES``), so the first allreduce starts early; an explicit ``bucket_cap_mb``
    caps every bucket. A bucket closes with the gradient that takes it to its cap or past it, so it may overshoot by
    one tensor (:func:`~course.ddp.buckets.assign_buckets` never overshoots, like Horovod's fusion buffer). With
    ``find_unused_parameters=True`` DDP keeps the buckets it built at first, from ``model.parameters()`` in order
    (the small one for the first-defined parameters). Taught in notebook 05.

    Returns:
        ``gradient_bytes``, ``bucket_cap_bytes``, ``first_bucket_cap_bytes``, ``sizes`` (each bucket's bytes, in the
        order reduced), ``buckets`` (allreduces per step), ``first_iteration_buckets`` (1) and ``fill`` (gradient
        bytes / bucket cap: below 1, one bucket holds every gradient, reduced once the last one is ready).
    """
    cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * 2**20)
    first = min(FIRST_BUCKET_BYTES, cap) if bucket_cap_mb is None else cap
    sizes, filled = [], 0
    order = arrival_order(model, inputs) if inputs is not None else \
        reversed([p for p in model.parameters() if p.requires_grad])
    for p in order:
        filled += p.numel() * p.element_size()
        if filled >= (cap if sizes else first):
            sizes, filled = [*sizes, filled], 0
    sizes += [filled] if filled else []
    total = gradient_bytes(model)
    return {"gradient_bytes": total, "bucket_cap_bytes": cap, "first_bucket_cap_bytes": first, "sizes": sizes,
            "buckets": len(sizes), "first_iteration_buckets": 1, "fill": total / cap}


# -- rank functions checked against DDP -------------------------------------------------------------------------
def _wrap(model: nn.Module, me: world.Rank, **kwargs) -> DistributedDataParallel:
    device_ids = [me.device.index] if me.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **kwargs)


def _batch(images: torch.Tensor, labels: torch.Tensor, index: int, batch_size: int, me: world.Rank
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``batch_size`` samples of global batch ``index`` (global batch = world_size x batch_size)."""
    start = (index * me.world_size + me.rank) * batch_size
    rows = torch.arange(start, start + batch_size) % len(labels)
    return images[rows].to(me.device), labels[rows].to(me.device)


#: The learning rate :func:`compare_with_ddp` trains each optimizer at.
_LR = {"sgd": 0.05, "momentum": 0.05, "adam": 1e-3}


def compare_with_ddp(optimizer: str = "momentum", steps: int = 3, batch_size: int = 16, seed: int = 0,
                     **options) -> dict[str, float]:
    """Rank function: train one model with DDP and a copy with :class:`DistributedOptimizer`, side by side.

    Same initial weights (seeded, then broadcast), same per-rank data shards, ``steps`` optimizer steps.
    ``options`` go to DistributedOptimizer; DDP gets the matching comm hook (sum, fp16) or ``no_sync``.

    Returns:
        ``max_diff``: largest |DDP parameter - our parameter| on this rank; ``spread``: largest difference of
        our parameters between this rank and rank 0 (0 when the ranks agree).
    """
    me = world.current()
    torch.manual_seed(seed)
    reference = DigitsCNN(width=4).to(me.device)
    ours = copy.deepcopy(reference)
    broadcast_parameters(ours.state_dict())
    ddp = _wrap(reference, me)
    if options.get("op", "avg") == "sum":
        ddp.register_comm_hook(None, ddp_hooks.summing)
    if options.get("compression", "none") == "fp16":
        ddp_hooks.compress_fp16(ddp)
    lr = _LR[check_choice("optimizer", optimizer, _LR)]
    ddp_optimizer = train.make_optimizer(optimizer, ddp.parameters(), lr)
    our_optimizer = DistributedOptimizer(train.make_optimizer(optimizer, ours.parameters(), lr),
                                         ours.named_parameters(), **options)
    passes = options.get("backward_passes_per_step", 1)
    digits = data.load().train
    try:
        for step in range(steps):
            for micro in range(passes):
                images, labels = _batch(*digits.tensors, step * passes + micro, batch_size, me)
                with ddp.no_sync() if micro < passes - 1 else contextlib.nullcontext():
                    nn.functional.cross_entropy(ddp(images), labels).backward()
                nn.functional.cross_entropy(ours(images), labels).backward()
            ddp_optimizer.step()
            ddp_optimizer.zero_grad()
            our_optimizer.step()
            our_optimizer.zero_grad()
    finally:
        our_optimizer.close()
    flat = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
    max_diff = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), ours.parameters(), strict=True))
    root = flat.clone()
    dist.broadcast(root, src=0)
    return {"max_diff": max_diff, "spread": (flat - root).abs().max().item()}


def compare_many(configs: list[dict], steps: int = 3) -> list[dict[str, float]]:
    """Rank function: :func:`compare_with_ddp` for each config in turn (one launch, many comparisons)."""
    return [compare_with_ddp(steps=steps, **config) for config in configs]


def no_sync_check(accumulation_steps: int = 4, batch_size: int = 32, seed: int = 0) -> dict[str, float]:
    """Rank function: gradient accumulation with ``no_sync`` equals one step on the whole per-rank batch.

    Three DDP copies of one model: ``whole`` sees this rank's ``batch_size`` samples at once; ``no_sync`` sees
    them as ``accumulation_steps`` micro-batches (loss divided by ``accumulation_steps``), allreducing only on
    the last; ``every_pass`` accumulates the same micro-batches but allreduces after each of them.

    Returns:
        ``max_grad_diff`` (no_sync vs whole) and ``max_grad_diff_every_pass`` (every_pass vs whole), and the
        allreduces each issued (``allreduces_whole``, ``allreduces_no_sync``, ``allreduces_every_pass``).
    """
    if batch_size % accumulation_steps:
        raise ValueError(f"batch_size={batch_size} must be a multiple of accumulation_steps={accumulation_steps}.")
    me = world.current()
    torch.manual_seed(seed)
    whole = DigitsCNN(width=8).to(me.device)
    copies = {"whole": whole, "no_sync": copy.deepcopy(whole), "every_pass": copy.deepcopy(whole)}
    calls: dict[str, list[int]] = {name: [] for name in copies}  # bucket indices, one per allreduce

    models = {name: _wrap(model, me) for name, model in copies.items()}
    for name, model in models.items():
        model.register_comm_hook(None, ddp_hooks.counting(calls[name].append))
    images, labels = _batch(*data.load().train.tensors, 0, batch_size, me)
    nn.functional.cross_entropy(models["whole"](images), labels).backward()
    for micro, (x, y) in enumerate(zip(images.chunk(accumulation_steps), labels.chunk(accumulation_steps),
                                       strict=True)):
        last = micro == accumulation_steps - 1
        with contextlib.nullcontext() if last else models["no_sync"].no_sync():
            (nn.functional.cross_entropy(models["no_sync"](x), y) / accumulation_steps).backward()
        (nn.functional.cross_entropy(models["every_pass"](x), y) / accumulation_steps).backward()

    def diff(name: str) -> float:
        pairs = zip(whole.parameters(), copies[name].parameters(), strict=True)
        return max((a.grad - b.grad).abs().max().item() for a, b in pairs)

    return {"max_grad_diff": diff("no_sync"), "max_grad_diff_every_pass": diff("every_pass"),
            **{f"allreduces_{name}": len(indices) for name, indices in calls.items()}}


def global_batch_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (biased) variance of ``x`` ``(B, C, H, W)`` over the batches of ALL ranks.

    What SyncBatchNorm computes in its forward pass: every rank allreduces its per-channel sum, sum of
    squares and count, so each normalises with the global batch's statistics, not its own shard's.
    """
    channels = x.shape[1]
    stats = torch.cat([x.sum(dim=(0, 2, 3)), (x * x).sum(dim=(0, 2, 3)),
                       torch.tensor([x.numel() / channels], device=x.device)]).double()
    dist.all_reduce(stats)
    count = stats[-1]
    mean = stats[:channels] / count
    return mean.float(), (stats[channels:2 * channels] / count - mean * mean).float()


def batchnorm_check(batch_size: int = 16, seed: int = 0) -> dict[str, float]:
    """Rank function: per-rank BatchNorm statistics vs the global batch's, and what synchronising fixes.

    Returns:
        ``local_error`` and ``synced_error``: largest |mean - global batch mean| over channels with this rank's
        own statistics and with :func:`global_batch_statistics`; on GPUs also ``syncbn_error`` from
        ``torch.nn.SyncBatchNorm`` (it needs GPU tensors, so it is not run on emulated ranks).
    """
    me = world.current()
    torch.manual_seed(seed)
    conv = nn.Conv2d(1, 4, 3, padding=1).to(me.device)
    broadcast_parameters(conv.state_dict())
    images, _ = data.load().train.tensors
    everyone = images[: me.world_size * batch_size].to(me.device)
    mine = everyone[me.rank * batch_size:(me.rank + 1) * batch_size]
    with torch.no_grad():
        target = conv(everyone).mean(dim=(0, 2, 3))
        features = conv(mine)
        result = {"local_error": (features.mean(dim=(0, 2, 3)) - target).abs().max().item(),
                  "synced_error": (global_batch_statistics(features)[0] - target).abs().max().item()}
    if me.device.type == "cuda":
        sync_bn = nn.SyncBatchNorm(4, momentum=1.0).to(me.device)  # momentum 1: running_mean = batch mean
        sync_bn(features)
        result["syncbn_error"] = (sync_bn.running_mean - target).abs().max().item()
    return result


def internals(accumulation_steps: int = 4) -> dict[str, dict[str, float]]:
    """Rank function: :func:`no_sync_check` and :func:`batchnorm_check` in one launch (for notebook 05)."""
    return {"no_sync": no_sync_check(accumulation_steps), "batchnorm": batchnorm_check()}


@exercise.checker
def check_shard(candidate: Callable[[int, int, int], Sequence[int]]) -> None:
    """Exercise checker: does ``candidate(n, rank, world_size)`` give the indices ``DistributedSampler`` gives?

    (``shuffle=False``: rank r takes every world_size-th index starting at r, after padding the dataset by
    wrapping around until its length divides by world_size.) Prints ``correct`` or raises ``AssertionError``.
    """
    from torch.utils.data import DistributedSampler

    for n, world_size in ((8, 4), (10, 4), (3, 4), (1197, 4), (5, 1)):
        for rank in range(world_size):
            expected = list(DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False))
            got = list(candidate(n, rank, world_size))
            if got != expected:
                raise AssertionError(f"n={n}, rank={rank}, world_size={world_size}: expected {expected[:12]}"
                                     f"{'...' if len(expected) > 12 else ''}, got {got[:12]}")
    print("correct: your shards match torch's DistributedSampler(shuffle=False)")
