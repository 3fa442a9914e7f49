"""A Horovod-style distributed optimizer, built from the course's own allreduce.

The gradient hooks, the communication thread and ``step()`` share one lock and one round of state: read the
class, and check it for races, in one piece.

Wrap any torch optimizer and data parallelism needs three more lines (the helpers are in ``course.ddp.horovod``)::

    rank = horovod.init()                                    # = course.world.init_from_env()
    horovod.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    horovod.broadcast_optimizer_state(optimizer, root_rank=0)

How it works, in the order ``notebooks/04b_distributed_optimizer.ipynb`` builds it:

1. **Hooks.** Each parameter gets a ``register_post_accumulate_grad_hook``: autograd calls it the moment that
   parameter's ``.grad`` is final, while backward is still running for the layers before it.
2. **Buckets** (``course.ddp.buckets``). Parameters are grouped, in the reverse order of ``named_parameters`` (roughly
   the order backward produces their gradients), into buckets of at most ``bucket_bytes``: one allreduce per bucket
   instead of one per tensor (fusion) amortises the per-message latency alpha of the alpha-beta model.
3. **Overlap.** A dedicated communication thread allreduces bucket 0, 1, 2, ... each as soon as it is full
   (flatten, optionally cast to fp16, allreduce, unflatten), while autograd computes the remaining gradients.
   Every rank processes the buckets in the same order: collectives must be issued in the same order everywhere.
4. **step()** waits for the outstanding buckets, then calls the wrapped optimizer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course.arguments import check_choice, check_count
from course.collectives import allreduce
from course.ddp.buckets import DEFAULT_BUCKET_BYTES, Bucket, assign_buckets, flatten, unflatten

OPS = ("avg", "sum")
#: Wire dtype per compression name; None sends gradients in their own dtype.
COMPRESSIONS: dict[str, torch.dtype | None] = {"none": None, "fp16": torch.float16}
#: How long step() waits for the communication thread before declaring a hang.
SYNC_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Event:
    """One thing that happened during a step, for timeline plots. Times are ``time.perf_counter()`` seconds.

    ``kind`` is ``"grad"`` (a parameter's gradient became final; ``start == end``) or ``"allreduce"`` (a bucket
    was flattened, reduced and unflattened, on the communication thread).
    """

    kind: str
    name: str
    start: float
    end: float


def _bucket_text(layout: list, index: int) -> str:
    if index >= len(layout):
        return f"no bucket {index}: {len(layout)} buckets in all"
    names, shapes, dtype = layout[index]
    return ", ".join(f"{name} {list(shape)}" for name, shape in zip(names, shapes, strict=True)) + f" ({dtype})"


class DistributedOptimizer:
    """Wraps a torch optimizer so ``step()`` applies gradients averaged (or summed) over all ranks.

    Args:
        optimizer: any ``torch.optim.Optimizer`` over the model's parameters (same on every rank).
        named_parameters: ``model.named_parameters()``; names label buckets and timeline events.
        op: ``"avg"`` (what DDP does) or ``"sum"`` of the gradients over ranks.
        compression: ``"none"`` or ``"fp16"`` (send gradients as float16: half the bytes, ~3 digits).
        bucket_bytes: capacity of one fused allreduce, in bytes of gradient.
        algorithm: a name in ``course.collectives.allreduce.ALGORITHMS`` (``"ring"``, ``"tree"``, ``"naive"``).
        backward_passes_per_step: backward passes accumulated locally before one allreduce (gradient
            accumulation; gradients are summed over passes, as in a single process).
        record_events: keep :class:`Event` s in ``self.events`` (for timeline plots; grows every step).
        group: process group; ``None`` for the default one.

    Raises:
        RuntimeError: no process group (call ``course.world.init_from_env()`` first).
        ValueError: a bad option, or ``named_parameters`` that do not match the optimizer's parameters.

    LR schedulers need the wrapped ``torch.optim.Optimizer``: pass them ``distributed.optimizer``.
    Taught in ``notebooks/04b_distributed_optimizer.ipynb``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 op: str = "avg", compression: str = "none", bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 algorithm: str = "ring", backward_passes_per_step: int = 1, record_events: bool = False,
                 group: dist.ProcessGroup | None = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}.")
        if not dist.is_initialized():
            raise RuntimeError("no process group: call course.world.init_from_env() (or run under "
                               "course.runtime.launch.launch / torchrun) before building a DistributedOptimizer.")
        self.optimizer = optimizer
        self.op = check_choice("op", op, OPS)
        self.compression = check_choice("compression", compression, COMPRESSIONS)
        self.algorithm = check_choice("algorithm", algorithm, allreduce.ALGORITHMS)
        self.backward_passes_per_step = check_count("backward_passes_per_step", backward_passes_per_step)
        self.record_events = record_events
        self.events: list[Event] = []
        # The communication thread gets a group of its own, as Horovod's background thread has its own
        # communicator: NCCL forbids one group used from two threads (the rank's own collectives run meanwhile).
        self.group = dist.new_group() if group is None else group
        self.world_size = dist.get_world_size(self.group)
        self.buckets = self._build_buckets(named_parameters, bucket_bytes)
        self._verify_buckets()
        self._where = {id(p): (b.index, name) for b in self.buckets for name, p in zip(b.names, b.params, strict=True)}
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._reset_round()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                         for b in self.buckets for p in b.params]
        self._thread = threading.Thread(target=self._communicate, name="course-allreduce", daemon=True)
        self._thread.start()

    # -- set-up ---------------------------------------------------------------------------------------------
    def _build_buckets(self, named_parameters: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("named_parameters has duplicate names; pass model.named_parameters().")
        in_optimizer = {id(p) for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad}
        named_ids = {id(p) for _, p in named}
        if in_optimizer != named_ids:
            raise ValueError(
                f"named_parameters names {len(named_ids)} trainable tensors but the optimizer holds "
                f"{len(in_optimizer)}, not the same ones: build both from the same model, e.g. "
                "DistributedOptimizer(SGD(model.parameters()), model.named_parameters())."
            )
        named.reverse()  # backward produces the last layer's gradients first
        buckets: list[Bucket] = []
        # Tensors of one bucket are flattened into one buffer, so each (dtype, device) gets its own buckets.
        for key in dict.fromkeys((p.dtype, p.device) for _, p in named):
            same = [(n, p) for n, p in named if (p.dtype, p.device) == key]
            for indices in assign_buckets([p.numel() * p.element_size() for _, p in same], bucket_bytes):
                buckets.append(Bucket(len(buckets), [same[i][0] for i in indices], [same[i][1] for i in indices]))
        return buckets

    def _verify_buckets(self) -> None:
        """Check once, as DDP does at construction, that every rank built the same buckets and options.

        Buckets are fixed from here on, so each step's allreduce can skip its own per-call agreement check
        (``check=False``): a model or an option that differs between ranks is named here instead of hanging
        (or silently mis-reducing) a step.
        """
        options = {"op": self.op, "compression": self.compression, "algorithm": self.algorithm,
                   "backward_passes_per_step": self.backward_passes_per_step}
        layout = [(b.names, [tuple(p.shape) for p in b.params], str(b.params[0].dtype)) for b in self.buckets]
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, (options, layout), group=self.group)
        odd = [rank for rank, theirs in enumerate(everyone) if theirs != everyone[0]]
        if not odd:
            return
        (their_options, theirs), (first_options, first) = everyone[odd[0]], everyone[0]
        if their_options != first_options:
            what = f"options {their_options} vs {first_options}"
        else:
            where = next((i for i, (a, b) in enumerate(zip(theirs, first, strict=False)) if a != b),
                         min(len(theirs), len(first)))
            what = f"bucket {where}: {_bucket_text(theirs, where)} vs {_bucket_text(first, where)}"
        raise ValueError(
            f"DistributedOptimizer needs the same model and options on every rank, but rank {odd[0]} differs from "
            f"rank 0 in {what} (ranks that differ from rank 0: {odd}). Build the model and the optimizer "
            "identically on every rank (same code, same sizes), then broadcast_parameters."
        )

    def _reset_round(self) -> None:
        """Forget the last step: every parameter again awaits ``backward_passes_per_step`` gradients."""
        self._remaining = {id(p): self.backward_passes_per_step for b in self.buckets for p in b.params}
        self._missing = [len(b.params) for b in self.buckets]
        self._ready: set[int] = set()
        self._next = 0  # the next bucket the communication thread will reduce
        self._synchronized = False

    # -- the hook (runs inside backward) --------------------------------------------------------------------
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        with self._cond:
            self._mark_ready(param, from_backward=True)

    def _mark_ready(self, param: torch.Tensor, from_backward: bool) -> None:
        bucket, name = self._where[id(param)]
        if self._remaining[id(param)] == 0:
            raise RuntimeError(
                f"the gradient of {name!r} was computed more than backward_passes_per_step="
                f"{self.backward_passes_per_step} time(s) before optimizer.step(): its allreduce has already "
                "been started, so this gradient would be lost or race with it. Call step() after every "
                "backward_passes_per_step backward passes, or raise backward_passes_per_step to accumulate."
            )
        self._remaining[id(param)] -= 1 if from_backward else self._remaining[id(param)]
        if self._remaining[id(param)] > 0:
            return
        if self.record_events:
            now = time.perf_counter()
            self.events.append(Event("grad", name, now, now))
        self._missing[bucket] -= 1
        if self._missing[bucket] == 0:
            self._ready.add(bucket)
            self._cond.notify_all()

    # -- the communication thread ---------------------------------------------------------------------------
    def _communicate(self) -> None:
        devices = {p.device for b in self.buckets for p in b.params if p.device.type == "cuda"}
        if devices:  # a new thread starts on cuda:0; this rank's GPU is the one its parameters live on
            torch.cuda.set_device(devices.pop())
        while True:
            with self._cond:
                while not self._closed and self._next not in self._ready:
                    self._cond.wait()
                if self._closed:
                    return
                bucket = self.buckets[self._next]
            try:
                self._reduce(bucket)
            except BaseException as error:  # noqa: B036 - step() must re-raise whatever killed the reduction
                with self._cond:
                    self._error = error
            with self._cond:
                self._next += 1
                self._cond.notify_all()

    def _reduce(self, bucket: Bucket) -> None:
        """Flatten the bucket's gradients, allreduce them with the course's algorithm, copy them back."""
        start = time.perf_counter()
        for p in bucket.params:
            if p.grad is None:  # unused this step on this rank: contribute zeros, as Horovod does
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in bucket.params]
        flat = flatten(grads)
        reduce = allreduce.ALGORITHMS[self.algorithm]
        wire_dtype = COMPRESSIONS[self.compression]
        if wire_dtype is None:  # every rank's buckets were verified equal once: no per-call check
            reduce(flat, op=self.op, group=self.group, check=False)
        else:
            if self.op == "avg":  # divide before the sum so float16 cannot overflow
                flat.div_(self.world_size)
            wire = flat.to(wire_dtype)
            reduce(wire, op="sum", group=self.group, check=False)
            flat.copy_(wire)
        unflatten(flat, grads)
        if self.record_events:
            self.events.append(Event("allreduce", f"bucket {bucket.index}", start, time.perf_counter()))

    # -- the optimizer interface ----------------------------------------------------------------------------
    def _in_flight(self) -> bool:
        return not self._synchronized and any(
            left < self.backward_passes_per_step for left in self._remaining.values())

    def synchronize(self) -> None:
        """Wait until every bucket is reduced; afterwards ``.grad`` holds the global gradient (clip it here).

        Parameters that got no gradient this step (unused) count as zeros, so every rank reduces every bucket.

        Raises:
            RuntimeError: called part-way through ``backward_passes_per_step`` passes, or an allreduce failed.
        """
        if self._synchronized:
            return
        with self._cond:
            partial = [self._where[k][1] for k, left in self._remaining.items()
                       if 0 < left < self.backward_passes_per_step]
            if partial:
                raise RuntimeError(
                    f"step()/synchronize() called part-way through backward_passes_per_step="
                    f"{self.backward_passes_per_step} backward passes ({partial[0]!r} has only part of its "
                    "gradient): no allreduce has started for it yet. Run all the passes before stepping."
                )
            for bucket in self.buckets:
                for p in bucket.params:
                    if self._remaining[id(p)] > 0:
                        self._mark_ready(p, from_backward=False)
            if not self._cond.wait_for(lambda: self._next == len(self.buckets), timeout=SYNC_TIMEOUT_S):
                raise RuntimeError(f"gradient allreduce did not finish in {SYNC_TIMEOUT_S:g} s: is a rank stuck?")
            error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"a gradient allreduce failed on the communication thread: {error!r}") from error
        self._synchronized = True

    def step(self, closure: None = None) -> None:
        """Wait for the gradient allreduce (see :func:`synchronize`), then take the wrapped optimizer's step."""
        if closure is not None:
            raise ValueError("DistributedOptimizer.step() takes no closure: a closure would run backward again "
                             "while gradients are being reduced. Call backward, then step().")
        self.synchronize()
        self.optimizer.step()
        with self._cond:
            self._reset_round()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``optimizer.zero_grad``, refused while gradients are still being reduced.

        Raises:
            RuntimeError: called after backward but before step()/synchronize().
        """
        with self._cond:
            if self._in_flight():
                raise RuntimeError(
                    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                    "optimizer.synchronize(). This is refused: the communication thread is still reading and "
                    "overwriting .grad (allreduce in flight), so zeroing now races with it and the step would "
                    "use a mix of zeros and reduced gradients. Call zero_grad() before backward, or after step()."
                )
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        return self.optimizer.state

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def close(self) -> None:
        """Remove the hooks and stop the communication thread (the model can then be used alone again)."""
        for handle in self._handles:
            handle.remove()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)


# -- for notebook 04b -------------------------------------------------------------------------------------------
def misuse_message() -> str:
    """Rank function: the error a rank gets for ``zero_grad()`` between ``backward()`` and ``step()``."""
    model = torch.nn.Linear(3, 1)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    model(torch.ones(2, 3)).sum().backward()
    try:
        optimizer.zero_grad()
        return "no error (the guard is missing!)"
    except RuntimeError as error:
        return str(error)
    finally:
        optimizer.step()
        optimizer.close()
