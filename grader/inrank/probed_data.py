"""The training data as the probes hand it to the student's script, and what they learn from it.

The probes (:mod:`grader.inrank.probes`) wrap ``data.load``: another split than the grader's is refused
(:func:`refuse_other_splits`), the training split comes back as a :class:`ProbedDataset`, and every
DataLoader over it is iterated by :func:`record_batches`, which notes the training-sample indices of each
batch the loop receives in :class:`TrainedBatches`, which tells the batches trained on from those only
fetched. :func:`true_val_accuracy` scores parameters on the whole validation split (for the
``report`` records). Nothing here writes records: only :mod:`grader.inrank.probes` may (see
:class:`grader.inrank.channel.Writer`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from course import data, models

SPLIT_DEFAULTS = {"seed": 0, "n_val": 300, "n_test": 300}  # data.load's split, which the grader's is


class ProbedDataset(TensorDataset):
    """The training split as the student receives it: the same tensors, a marker for the probes."""

    def __init__(self, dataset: TensorDataset) -> None:
        super().__init__(*dataset.tensors)


class Catalogue:
    """Names the training samples in any batch a model consumes, by content, however the batch was made.

    A batch from a DataLoader, a custom sampler, a pre-sharded tensor or a dataset indexed on the device holds
    the same sample contents. Each sample is keyed by its standardized contents (so scaling or shifting every
    input alike, e.g. a normalization, keeps the key) projected on a fixed direction; a batch row matches the
    training sample with the nearest key whose standardized contents are equal within :data:`MATCH`.
    """

    MATCH = 1e-3  # largest difference of standardized contents (float32 copies, another device)

    def __init__(self, images: torch.Tensor) -> None:
        rows = _standardized(images)
        self.per_sample = rows.shape[1] if rows.dim() == 2 else 0
        self.direction = torch.randn(self.per_sample, generator=torch.Generator().manual_seed(0),
                                     dtype=torch.float64)
        keys = rows @ self.direction
        self.keys, self.order = keys.sort()
        self.rows = rows

    def fits(self, batch: torch.Tensor) -> bool:
        """``batch`` could hold training samples: floating point, each of a sample's size."""
        return batch.dim() >= 2 and batch.is_floating_point() and batch[0].numel() == self.per_sample \
            and len(self.keys) > 0

    def lookup(self, batch: torch.Tensor) -> list[int] | None:
        """The training-sample index of every row of ``batch``, or None when not all of them are training
        samples (activations, validation data, augmented inputs)."""
        if not self.fits(batch):
            return None
        rows = _standardized(batch)
        keys = rows @ self.direction
        low = torch.searchsorted(self.keys, keys - self.MATCH * self.per_sample ** 0.5)
        high = torch.searchsorted(self.keys, keys + self.MATCH * self.per_sample ** 0.5, right=True)
        found = torch.full((len(rows),), -1, dtype=torch.long)
        for offset in range(int((high - low).max())):  # every row's candidates at once, in key order
            at = low + offset
            open_ = (found < 0) & (at < high)
            if not bool(open_.any()):
                break
            candidates = self.order[at[open_]]
            close = (self.rows[candidates] - rows[open_]).abs().amax(dim=1) <= self.MATCH
            found[open_.nonzero().squeeze(1)[close]] = candidates[close]
        return None if bool((found < 0).any()) else found.tolist()


def _standardized(images: torch.Tensor) -> torch.Tensor:
    """Each sample's contents (float64, on the CPU), less their mean, over their standard deviation."""
    rows = images.detach().reshape(images.shape[0], -1).to("cpu", torch.float64)
    rows = rows - rows.mean(dim=1, keepdim=True)
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12) * rows.shape[1] ** 0.5


class RecordedBatches:
    """Stands in for a training DataLoader's batch sampler: notes every index batch as it is dispatched.

    Dispatch happens in the rank's own process even with DataLoader workers, and batches come back in
    dispatch order, so the probes pair each batch the loop receives with its indices.
    """

    def __init__(self, inner: Any, dispatched: deque) -> None:
        self.inner, self.dispatched = inner, dispatched

    def __iter__(self):
        for batch in self.inner:
            self.dispatched.append([int(batch)] if isinstance(batch, int) else [int(i) for i in batch])
            yield batch

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def record_batches(loader: DataLoader, original: Any, batches: TrainedBatches) -> Iterator[Any]:
    """Iterate ``loader`` with DataLoader's ``original`` ``__iter__``, noting each batch in ``batches`` (its
    training-sample indices and a signature of its contents) as the batch arrives."""
    name = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    if not isinstance(getattr(loader, name), RecordedBatches):
        # DataLoader refuses to change its sampler after construction; the probes do it once, on purpose
        object.__setattr__(loader, name, RecordedBatches(getattr(loader, name), deque()))
    dispatched = getattr(loader, name).dispatched
    dispatched.clear()
    for item in original(loader):
        if dispatched:
            batches.fetched(dispatched.popleft(), item)
        yield item


class TrainedBatches:
    """The training batches a rank fetched since its last optimizer step, and which of them it trained on.

    A batch is *trained* when a module receives it (or a copy of it: another device, another dtype) in a
    forward pass with gradients enabled: that forward's backward feeds the next optimizer step. A batch only
    fetched (a peek for a log line, ``len(next(iter(loader))[0])``) is not trained, and not counted. When no
    fetched batch is seen in a forward (the script transforms its inputs first), all of them count, as fetched.
    The precision of the trained forwards (autocast's dtype, or the module's own) is noted for the replay.
    """

    def __init__(self) -> None:
        self.catalogue: Catalogue | None = None  # set when the script loads the training split
        self._consumed: list[list[int]] = []  # training samples the model consumed since the last step
        self._batches: list[tuple[list[int], torch.Tensor | None]] = []  # (indices, per-sample sums)
        self._sizes: list[int] = []  # elements per sample of each batch's first tensor
        self._used: set[int] = set()
        self._seen: set[int] = set()  # ids of the tensors already matched to a batch since the last step
        self._looked: dict[int, tuple[torch.Tensor, int]] = {}  # tensors looked up since the last step
        self.precision: str | None = None

    def fetched(self, indices: list[int], item: Any) -> None:
        first = _first_tensor(item, len(indices))
        self._batches.append((indices, _signature(first)))
        self._sizes.append(first[0].numel() if first is not None else 0)

    def forward(self, module: torch.nn.Module, args: tuple) -> None:
        """A module's forward is about to run on ``args``: mark the fetched batch among them as trained (the
        latest fetched that matches: a peeked batch can hold the same samples as the one trained on)."""
        if not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return
        self._consume(module, args)
        if not self._batches:
            return
        for arg in _tensors(args):
            if id(arg) in self._seen:  # a submodule's forward on the same tensor: one batch per tensor
                continue
            sums = None
            for i in reversed(range(len(self._batches))):
                indices, signature = self._batches[i]
                if i in self._used or signature is None or arg.shape[0] != len(indices) \
                        or arg.numel() != len(indices) * self._sizes[i]:
                    continue
                sums = _signature(arg) if sums is None else sums
                if sums is not None and torch.allclose(sums, signature, rtol=1e-2, atol=1e-2):
                    self._used.add(i)
                    self._seen.add(id(arg))
                    self.precision = self.precision or _precision(module, arg)
                    break

    def _consume(self, module: torch.nn.Module, args: tuple) -> None:
        """Note the training samples among a forward's inputs, by content (:class:`Catalogue`): once per batch
        (a wrapper's forward and its module's see the same batch), so the model's own input is what counts."""
        if self.catalogue is None:
            return
        for arg in _tensors(args):
            if not self.catalogue.fits(arg) or self._looked_up(arg):
                continue
            indices = self.catalogue.lookup(arg)
            if indices is not None and indices not in self._consumed:
                self._consumed.append(indices)
                if not self._batches:
                    self.precision = self.precision or _precision(module, arg)

    def _looked_up(self, arg: torch.Tensor) -> bool:
        """``arg`` itself, unchanged, was looked up since the last step (a wrapper's forward and its module's
        get the same tensor); else it is noted, and held, so that its id is not reused before the step."""
        tensor, version = self._looked.get(id(arg), (None, -1))
        if tensor is arg and version == arg._version:
            return True
        self._looked[id(arg)] = (arg, arg._version)
        return False

    def take(self) -> tuple[list[int], str | None]:
        """The indices of the training samples the model consumed since the last step (else the trained
        batches', else every fetched batch's) and their precision; starts afresh."""
        kept = [b for i, b in enumerate(self._batches) if i in self._used] or self._batches
        indices, precision = [i for batch, _ in kept for i in batch], self.precision
        if self._consumed:
            indices = [i for batch in self._consumed for i in batch]
        self._batches, self._sizes, self._used, self._seen, self.precision = [], [], set(), set(), None
        self._consumed, self._looked = [], {}
        return indices, precision


def _first_tensor(item: Any, size: int) -> torch.Tensor | None:
    """The first tensor of a batch (``(images, labels)``) holding ``size`` samples, or None."""
    return next((t for t in _tensors(item if isinstance(item, (tuple, list)) else (item,))
                 if t.dim() >= 1 and t.shape[0] == size), None)


def _tensors(args: Any) -> list[torch.Tensor]:
    """The non-empty tensors among ``args`` and one level of lists or tuples inside it."""
    out = []
    for arg in args:
        out += [a for a in (arg if isinstance(arg, (tuple, list)) else (arg,))
                if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.numel() > 0]
    return out


def _signature(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Per-sample sums (float64, on the CPU): the same for a batch and its copies on any device or dtype."""
    if tensor is None or not (tensor.is_floating_point() or tensor.dtype in (torch.uint8, torch.int64)):
        return None
    return tensor.detach().reshape(tensor.shape[0], -1).to("cpu", torch.float64).sum(dim=1)


def _precision(module: torch.nn.Module, arg: torch.Tensor) -> str | None:
    """``bfloat16`` / ``float16`` when the forward runs under autocast or on half-precision inputs or
    parameters, else None (float32)."""
    device = arg.device.type
    if torch.is_autocast_enabled(device):
        return str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    param = next(module.parameters(), None)
    low = [t.dtype for t in (arg, param) if t is not None and t.dtype in (torch.bfloat16, torch.float16)]
    return str(low[0]).removeprefix("torch.") if low else None


def true_val_accuracy(params: list[torch.Tensor], val: TensorDataset | None) -> float | None:
    """Accuracy on the whole validation split (``val``, else ``data.load().val``) of a DigitsCNN holding
    ``params``; None when they are not a DigitsCNN's."""
    try:
        with torch.random.fork_rng(devices=[]):
            model = models.DigitsCNN(width=params[0].shape[0])
        reference = list(model.parameters())
        if [p.shape for p in reference] != [p.shape for p in params]:
            return None
        with torch.no_grad():
            for mine, theirs in zip(reference, params, strict=True):
                mine.copy_(theirs.detach().to("cpu"))
            images, labels = (val if val is not None else data.load().val).tensors
            model.eval()
            return float((model(images).argmax(dim=1) == labels).float().mean())
    except (RuntimeError, IndexError, ValueError):
        return None


def refuse_other_splits(function: str, arguments: dict[str, Any]) -> None:
    """Raise if the split asked for is not the grader's (seed 0, the default validation and test sizes).

    Raises:
        ValueError: naming the argument, what the grader expects, and the fix.
    """
    for name, expected in SPLIT_DEFAULTS.items():
        if name in arguments and arguments[name] != expected:
            raise ValueError(f"data.{function}({name}={arguments[name]!r}): the assignment trains on the course's "
                             f"fixed split ({name}={expected}); another split would put held-out samples into "
                             f"training. Call data.{function}() without {name}=.")
