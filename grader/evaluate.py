"""Evaluate a submitted checkpoint, by the grader, in a clean process, on data the student never received.

``python -m grader.evaluate CHECKPOINT --seed N`` prints one JSON line: ``{"accuracy": ...}`` or
``{"error": "..."}``. The checkpoint is loaded with ``torch.load(weights_only=True)`` (tensors only: a
pickle that tries to run code is refused), must be a ``DigitsCNN`` state_dict (a ``module.`` prefix left by
DDP is accepted), and is evaluated on the test split, which the harness hides from the student's script.
The grader chooses the seed. Used by the grader of notebook 06.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from course import data, models


class CheckpointError(ValueError):
    """The checkpoint is missing, not loadable with weights_only, or not a DigitsCNN state_dict."""


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The model weights in ``path``, with any DDP ``module.`` prefix removed.

    Raises:
        CheckpointError: missing file, not a tensors-only checkpoint, or not a dict of tensors.
    """
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path.name}: save model.state_dict() there, on rank 0.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  (any unreadable file is the submission's fault)
        raise CheckpointError(f"{path.name} cannot be loaded with torch.load(weights_only=True): "
                              f"{type(error).__name__}: {str(error)[:200]}. Save model.state_dict() "
                              "with torch.save, nothing else.") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} is not a state_dict (a dict of tensors): save model.state_dict().")
    return {k.removeprefix("module."): v for k, v in state.items()}


def build_model(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A ``DigitsCNN`` holding ``state`` (its width read from the first conv layer's weights).

    Raises:
        CheckpointError: the weights do not fit a DigitsCNN.
    """
    first = state.get("features.0.weight")
    if first is None or first.dim() != 4:
        raise CheckpointError("the checkpoint has no features.0.weight: it is not a course.models.DigitsCNN "
                              "state_dict. Keep the model of the starter script.")
    model = models.DigitsCNN(in_channels=first.shape[1], width=first.shape[0])
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(f"the checkpoint does not fit DigitsCNN: {str(error)[:300]}") from None
    return model


@torch.no_grad()
def test_accuracy(path: Path, seed: int, test_data: Path | None = None) -> float:
    """Accuracy in [0, 1] of the checkpoint at ``path`` on the test split, batches in a seeded order.

    Args:
        test_data: a file of ``{"images", "labels"}`` tensors the grader wrote (saves loading the dataset
            here); default ``course.data.load().test``.
    """
    model = build_model(load_state_dict(path)).eval()
    torch.manual_seed(seed)
    if test_data is None:
        images, labels = data.load().test.tensors
    else:
        split = torch.load(test_data, weights_only=True)
        images, labels = split["images"], split["labels"]
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    correct = 0
    for batch in order.split(128):
        correct += int((model(images[batch]).argmax(dim=1) == labels[batch]).sum())
    return correct / len(labels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.evaluate")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-data", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        print(json.dumps({"accuracy": test_accuracy(args.checkpoint, args.seed, args.test_data)}))
    except CheckpointError as error:
        print(json.dumps({"error": str(error)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
