"""The training data as the probes hand it to the student's script, and what they learn from it.

The probes (:mod:`grader.inrank.probes`) wrap ``data.load``: another split than the grader's is refused
(:func:`refuse_other_splits`), the training split comes back as a :class:`ProbedDataset`, and every
DataLoader over it is iterated by :func:`record_batches`, which notes the training-sample indices of each
batch the loop receives. :func:`true_val_accuracy` scores parameters on the whole validation split (for the
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


def record_batches(loader: DataLoader, original: Any, fetched: list[int]) -> Iterator[Any]:
    """Iterate ``loader`` with DataLoader's ``original`` ``__iter__``, adding each batch's training-sample
    indices to ``fetched`` as the batch arrives."""
    name = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    if not isinstance(getattr(loader, name), RecordedBatches):
        # DataLoader refuses to change its sampler after construction; the probes do it once, on purpose
        object.__setattr__(loader, name, RecordedBatches(getattr(loader, name), deque()))
    dispatched = getattr(loader, name).dispatched
    dispatched.clear()
    for item in original(loader):
        if dispatched:
            fetched.extend(dispatched.popleft())
        yield item


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
