"""Input checks shared by the optimizers of notebooks 01 and 02: turn a deep torch traceback into one clear error.

A model built for one input shape, given data of another, fails several calls deep inside ``nn.Linear`` or
``conv2d`` with a message about matrix sizes; a class label above the model's number of outputs fails inside
``cross_entropy`` (and on a GPU as an asynchronous device assert). :func:`check_model_fits_data` runs one sample
through the model and the loss up front and says, in a ``ValueError``, what was expected, what it got and
how to fix it. :func:`check_count` accepts any integer type (``5``, ``np.int64(5)``), never a bool or a float;
:func:`check_choice` a name from a set; :func:`check_batch` a batch of inputs and targets; :func:`check_lr` a
learning rate.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Iterable

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_count(name: str, value: object, minimum: int = 1, unit: str = "", maximum: int | None = None) -> int:
    """``value`` as a Python int if it is an integer (any ``numbers.Integral`` but bool) >= ``minimum`` (and
    <= ``maximum``, if given).

    ``unit`` says what is counted, for the message: ``check_count("batch_size", 0, unit="number of samples")``
    raises "batch_size must be a positive integer number of samples, got 0 (int).".

    Raises:
        ValueError: anything else, saying what was expected and what was given.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum \
            or (maximum is not None and value > maximum):
        unit = f" {unit}" if unit else ""
        if maximum is not None:
            wanted = f"an integer{unit} from {minimum} to {maximum}"
        else:
            wanted = ("a positive integer" if minimum == 1 else f"an integer >= {minimum}") + unit
        raise ValueError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__}).")
    return int(value)


def check_choice(name: str, value: object, allowed: Iterable[str]) -> str:
    """``value`` if it is one of ``allowed``, e.g. an option's name among those allowed.

    Raises:
        ValueError: anything else, listing the allowed values and what was given.
    """
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
    return value  # type: ignore[return-value]


def check_model_fits_data(model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """Run ``loss_fn(model(inputs[:1]), targets[:1])`` once, without gradients and in eval mode (the model's
    mode is restored), to catch a mismatch up front.

    Args:
        inputs: ``(N, ...)``, N >= 1. targets: ``(N,)`` class labels or ``(N, ...)`` real-valued targets.

    Raises:
        ValueError: the model cannot take one sample of ``inputs`` (wrong sample shape, dtype or device), a
            class label is outside ``0 .. outputs - 1``, or the loss refuses the output and target.
    """
    sample, training = tuple(inputs.shape[1:]), model.training
    try:
        # eval mode: no BatchNorm statistics updated, no dropout randomness drawn; the run is not disturbed
        with torch.no_grad():
            output = model.eval()(inputs[:1])
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        raise ValueError(
            f"the model cannot take the inputs: one sample has shape {sample} ({inputs.dtype}, {inputs.device}); "
            f"torch said: {str(error).splitlines()[0]} Expected samples of the shape (and dtype, device) the "
            f"model was built for: build it for input_shape={sample}, or reshape the inputs."
        ) from error
    finally:
        model.train(training)
    if not targets.is_floating_point() and output.dim() == 2 and len(targets):
        low, high = int(targets.min()), int(targets.max())
        if low < 0 or high >= output.shape[1]:
            raise ValueError(
                f"class labels must be in 0..{output.shape[1] - 1} for a model with {output.shape[1]} outputs, "
                f"got labels from {low} to {high}: build the model with num_classes={high + 1}, or relabel."
            )
    try:
        # only whether the loss runs matters here; a broadcasting warning is the caller's to raise (full_loss)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            loss_fn(output, targets[:1])
    except (RuntimeError, ValueError, IndexError) as error:
        raise ValueError(
            f"the loss refuses the model's output {tuple(output.shape)} with targets {tuple(targets[:1].shape)} "
            f"({targets.dtype}); torch said: {str(error).splitlines()[0]} Expected class labels (int64, shape "
            f"(N,)) for cross-entropy, or targets of the output's shape for a regression loss."
        ) from error


def check_batch(inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Validate a batch and return its size.

    Raises:
        ValueError: the batch is empty or ``inputs`` and ``targets`` hold different numbers of samples.
    """
    if inputs.dim() == 0 or targets.dim() == 0:
        raise ValueError(f"inputs and targets need a batch dimension, got shapes {tuple(inputs.shape)} and "
                         f"{tuple(targets.shape)}.")
    if len(inputs) != len(targets):
        raise ValueError(f"inputs hold {len(inputs)} samples but targets hold {len(targets)}: they must match "
                         f"(got shapes {tuple(inputs.shape)} and {tuple(targets.shape)}).")
    if len(inputs) == 0:
        raise ValueError("the batch is empty (batch size 0): give at least one sample.")
    return len(inputs)


def check_lr(lr: float) -> float:
    """Validate a learning rate. Raises ValueError unless ``lr`` is a finite number >= 0."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (0 <= lr < float("inf")):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}.")
    return float(lr)
