"""A Horovod-style distributed optimizer, built from the course's own allreduce.

Wrap any torch optimizer and data parallelism needs three more lines::

    rank = distributed_optimizer.init()                      # = course.world.init_from_env()
    distributed_optimizer.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    distributed_optimizer.broadcast_optimizer_state(optimizer, root_rank=0)

How it works, in the order ``notebooks/04b_distributed_optimizer.ipynb`` builds it:

1. **Hooks.** Each parameter gets a ``register_post_accumulate_grad_hook``: autograd calls it the moment that
   parameter's ``.grad`` is final, while backward is still running for the layers before it.
2. **Buckets.** Parameters are grouped, in the reverse order of ``named_parameters`` (roughly the order backward
   produces their gradients), into buckets of at most ``bucket_bytes``: one allreduce per bucket instead of
   one per tensor (fusion) amortises the per-message latency alpha of the alpha-beta model.
3. **Overlap.** A dedicated communication thread allreduces bucket 0, 1, 2, ... each as soon as it is full
   (flatten, optionally cast to fp16, allreduce, unflatten), while autograd computes the remaining gradients.
   Every rank processes the buckets in the same order: collectives must be issued in the same order everywhere.
4. **step()** waits for the outstanding buckets, then calls the wrapped optimizer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course import allreduce
from course.world import init_from_env as init  # noqa: F401 - Horovod's API shape: hvd.init()

#: PyTorch DDP's default bucket_cap_mb is 25 MB; the same default here makes the two comparable.
DEFAULT_BUCKET_BYTES = 25 * 2**20
OPS = ("avg", "sum")
#: Wire dtype per compression name; None sends gradients in their own dtype.
COMPRESSIONS: dict[str, torch.dtype | None] = {"none": None, "fp16": torch.float16}
#: How long step() waits for the communication thread before declaring a hang.
SYNC_TIMEOUT_S = 300.0


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one allreduce.

    Attributes:
        index: position in the fixed order every rank allreduces buckets in.
        names, params: the parameters, in the order their gradients are expected.
    """

    index: int
    names: list[str]
    params: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


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


def assign_buckets(grad_bytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensors, in the given order, into consecutive buckets of at most ``bucket_bytes`` each.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own. Taught (as an exercise) in notebook 04b.

    Args:
        grad_bytes: size in bytes of each gradient, in the order backward produces them.
        bucket_bytes: capacity of one bucket, > 0.

    Returns:
        Lists of indices into ``grad_bytes``; concatenated they are ``0, 1, ..., len(grad_bytes) - 1``.
    """
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}.")
    buckets: list[list[int]] = []
    filled = 0
    for index, size in enumerate(grad_bytes):
        if not buckets or filled + size > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += size
    return buckets


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Copy ``tensors`` (same dtype and device) into one new 1-D buffer, so one allreduce moves them all."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``flat`` back into ``tensors``, in place (inverse of :func:`flatten`)."""
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


def _bucket_text(layout: list, index: int) -> str:
    if index >= len(layout):
        return f"no bucket {index}: {len(layout)} buckets in all"
    names, shapes, dtype = layout[index]
    return ", ".join(f"{name} {list(shape)}" for name, shape in zip(names, shapes, strict=True)) + f" ({dtype})"


def _choice(name: str, value: object, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
    return value  # type: ignore[return-value]


class DistributedOptimizer:
    """Wraps a torch optimizer so ``step()`` applies gradients averaged (or summed) over all ranks.

    Args:
        optimizer: any ``torch.optim.Optimizer`` over the model's parameters (same on every rank).
        named_parameters: ``model.named_parameters()``; names label buckets and timeline events.
        op: ``"avg"`` (what DDP does) or ``"sum"`` of the gradients over ranks.
        compression: ``"none"`` or ``"fp16"`` (send gradients as float16: half the bytes, ~3 digits).
        bucket_bytes: capacity of one fused allreduce, in bytes of gradient.
        algorithm: a name in ``course.allreduce.ALGORITHMS`` (``"ring"``, ``"tree"``, ``"naive"``).
        backward_passes_per_step: backward passes accumulated locally before one allreduce (gradient
            accumulation; gradients are summed over passes, as in a single process).
        record_events: keep :class:`Event` s in ``self.events`` (for timeline plots; grows every step).
        group: process group; ``None`` for the default one.

    Raises:
        RuntimeError: no process group (call :func:`init` first).
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
                               "course.launch.launch / torchrun) before building a DistributedOptimizer.")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}.")
        self.optimizer = optimizer
        self.op = _choice("op", op, OPS)
        self.compression = _choice("compression", compression, COMPRESSIONS)
        self.algorithm = _choice("algorithm", algorithm, allreduce.ALGORITHMS)
        self.backward_passes_per_step = backward_passes_per_step
        self.record_events = record_events
        self.events: list[Event] = []
        self.group = group
        self.world_size = dist.get_world_size(group)
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


def _tensors_of(params: Mapping[str, torch.Tensor] | Iterable) -> list[torch.Tensor]:
    items = list(params.values()) if isinstance(params, Mapping) else list(params)
    tensors = [item[1] if isinstance(item, tuple) else item for item in items]
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"expected tensors, a state_dict or named_parameters, got a {type(tensor).__name__}.")
    return tensors


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable, root_rank: int = 0,
                         group: dist.ProcessGroup | None = None) -> None:
    """Overwrite, in place, every rank's tensors with ``root_rank``'s: the same starting point everywhere.

    Args:
        params: ``model.state_dict()`` (parameters and buffers), ``model.named_parameters()`` or tensors.
        root_rank: the rank whose values win.
    """
    with torch.no_grad():
        for tensor in _tensors_of(params):
            buffer = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
            dist.broadcast(buffer, src=root_rank, group=group)
            if buffer.data_ptr() != tensor.data_ptr():
                tensor.copy_(buffer)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer | DistributedOptimizer, root_rank: int = 0,
                              group: dist.ProcessGroup | None = None) -> None:
    """Give every rank ``root_rank``'s optimizer state (momentum, Adam moments, step counts, learning rates).

    Works for any optimizer, also when the other ranks have no state yet (e.g. resuming from rank 0's checkpoint).
    """
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    holder = [inner.state_dict() if dist.get_rank(group) == root_rank else None]
    dist.broadcast_object_list(holder, src=root_rank, group=group)
    if dist.get_rank(group) != root_rank:
        inner.load_state_dict(holder[0])


def allreduce_metric(value: float | torch.Tensor, op: str = "avg", algorithm: str = "ring",
                     group: dist.ProcessGroup | None = None) -> float | torch.Tensor:
    """Average (or sum) a metric over ranks, e.g. each rank's validation loss.

    Averaging per-rank means is only right when every rank saw as many samples; otherwise reduce sums and
    counts, ``allreduce_metric(torch.tensor([loss_sum, count]), op="sum")``, and divide.

    Returns:
        A float for a number, a new float64 tensor for a tensor; the input is not modified.
    """
    _choice("op", op, OPS)
    tensor = torch.as_tensor(value, dtype=torch.float64).clone()
    if dist.is_initialized():
        allreduce.ALGORITHMS[_choice("algorithm", algorithm, allreduce.ALGORITHMS)](tensor, op=op, group=group)
    return tensor if isinstance(value, torch.Tensor) else tensor.item()


# -- for notebook 04b -------------------------------------------------------------------------------------------
def check_assign_buckets(candidate: Callable[[list[int], int], list[list[int]]]) -> None:
    """Exercise checker: does ``candidate(grad_bytes, bucket_bytes)`` bucket like :func:`assign_buckets`?

    Prints ``correct`` or raises ``AssertionError`` naming the first case that differs.
    """
    cases = [([4, 4, 4], 8), ([10, 1, 1], 4), ([1, 2, 3, 4, 5], 6), ([7], 1), ([0, 0, 3], 3), ([], 5)]
    for sizes, cap in cases:
        expected, got = assign_buckets(sizes, cap), candidate(list(sizes), cap)
        if got != expected:
            raise AssertionError(f"for grad_bytes={sizes}, bucket_bytes={cap}: expected {expected}, got {got}.")
    print(f"correct: all {len(cases)} cases bucket like course.distributed_optimizer.assign_buckets")


def horovod_recipe(steps: int = 5, batch_size: int = 16, seed: int = 0) -> dict[str, object]:
    """Rank function for notebook 04b: the whole Horovod recipe, from differing random starts to one metric.

    Every rank builds its model with its own seed and its optimizer with its own learning rate (as if
    misconfigured), then: :func:`init`, :func:`broadcast_parameters` and :func:`broadcast_optimizer_state` from
    rank 0, ``steps`` steps of :class:`DistributedOptimizer` on this rank's shard of a synthetic regression
    (``batch_size`` samples per rank per step), and :func:`allreduce_metric` of the shard's loss.

    Returns:
        Plain numbers: ``lr_before``/``lr_after``, the first weight ``weight_before``/``weight_after`` the
        broadcast, ``weights`` after training (all of them), this rank's ``loss`` and the ``avg_loss`` over ranks.
    """
    rank = init()
    torch.manual_seed(seed + rank.rank)  # a different start on every rank ...
    model = torch.nn.Linear(4, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.05 * (rank.rank + 1), momentum=0.9)
    weight_before, lr_before = model.weight[0, 0].item(), inner.param_groups[0]["lr"]
    broadcast_parameters(model.state_dict(), root_rank=0)  # ... until rank 0's wins
    optimizer = DistributedOptimizer(inner, model.named_parameters())
    broadcast_optimizer_state(optimizer, root_rank=0)
    generator = torch.Generator().manual_seed(seed)  # one dataset; each rank takes its own rows
    x = torch.randn(steps * batch_size * rank.world_size, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(len(x), 1, generator=generator)
    x, y = x[rank.rank::rank.world_size], y[rank.rank::rank.world_size]  # (steps * batch_size, 4), (.., 1)
    try:
        for step in range(steps):
            rows = slice(step * batch_size, (step + 1) * batch_size)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
    finally:
        optimizer.close()
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x), y).item()
    return {"lr_before": lr_before, "lr_after": optimizer.param_groups[0]["lr"], "weight_before": weight_before,
            "weight_after": model.weight[0, 0].item(), "weights": model.weight.flatten().tolist(),
            "loss": loss, "avg_loss": allreduce_metric(loss)}


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
