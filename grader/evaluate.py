"""Evaluate a submitted checkpoint, by the grader, in a clean process, on data the student never received.

``python -m grader.evaluate CHECKPOINT --seed N`` prints one JSON line: ``{"accuracy": ..., "val_accuracy":
..., "fingerprint": [...]}`` or ``{"error": "..."}``. The checkpoint is loaded with
``torch.load(weights_only=True)`` (tensors only: a pickle that tries to run code is refused), must be a
``DigitsCNN`` state_dict (a ``module.`` prefix left by DDP or ``AveragedModel``, or ``_orig_mod.`` by
torch.compile, is accepted, as is ``AveragedModel``'s ``n_averaged``).

``accuracy`` is measured on a :func:`perturbed` copy of the test split: the same held-out digits, each moved
by a small random affine jitter (rotation, scale, sub-pixel shift) and given pixel noise, all drawn from the
grader's seed. The harness hides the test split from the student's script, but the digits are public
(scikit-learn ships them); the jitter and noise make the exact samples the grader scores unknowable without
the seed, which depends on the submission and on the instructor's secret (:mod:`grader.secret`), and never
enters the student's processes (see :mod:`grader.runner`, :func:`grader.inrank.harness.probe_seed`). They do not
stop a model trained on the clean public test digits from scoring well (measured once: 0.99-1.00 against
the reference's 0.95-0.98): what stops that is that the grader evaluates only parameters rank 0's optimizer
produced under the probes (``digests``, :func:`grader.evidence.bind_checkpoint`).
``val_accuracy`` (whole validation split, no noise), ``fingerprint`` (as the probes compute it) and
``digests`` (:func:`grader.inrank.fingerprints.digests`) let the grader check the student's records against the model
actually submitted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from course import data, models
from grader.inrank.fingerprints import digests, fingerprint
from grader.inrank.harness import probe_seed

NOISE_STD = 0.06  # of the pixel noise on the held-out images (pixels in [0, 1])
# the affine jitter of each held-out image, uniform in +-: degrees of rotation, relative scale, pixels of shift.
# Measured on one reference checkpoint over 200 seeds: 0.943-0.98, mean 0.961 (noise 0.08 alone: 0.953-0.98,
# mean 0.967; target 0.92). A whole-pixel shift of these 8x8 digits would cost it 40 points.
JITTER = (2.0, 0.02, 0.2)


#: Keys an averaged model adds to its state_dict (torch.optim.swa_utils.AveragedModel's count of averages).
AVERAGING_KEYS = ("n_averaged",)


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
    return {_unwrapped(k): v for k, v in state.items() if k not in AVERAGING_KEYS}


def _unwrapped(key: str) -> str:
    """A state_dict key without the prefixes wrappers add: DDP's ``module.``, torch.compile's ``_orig_mod.``."""
    while key.startswith(("module.", "_orig_mod.")):
        key = key.removeprefix("module.").removeprefix("_orig_mod.")
    return key


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


def jittered(images: torch.Tensor, generator: torch.Generator, jitter: tuple[float, float, float] = JITTER
             ) -> torch.Tensor:
    """``images`` (N, C, H, W), each rotated, scaled and shifted (bilinear) by its own draw within ``jitter``
    (degrees, relative scale, pixels), from ``generator``."""
    n, _, height, width = images.shape
    degrees, scale, shift = jitter

    def uniform() -> torch.Tensor:  # (N,) in [-1, 1)
        return 2 * torch.rand(n, generator=generator, dtype=torch.float64) - 1

    angle, size = uniform() * math.radians(degrees), 1 + uniform() * scale
    dx, dy = uniform() * 2 * shift / width, uniform() * 2 * shift / height  # affine_grid's units: half-widths
    cos, sin = size * torch.cos(angle), size * torch.sin(angle)
    theta = torch.stack([torch.stack([cos, -sin, dx], 1), torch.stack([sin, cos, dy], 1)], 1)  # (N, 2, 3)
    grid = torch.nn.functional.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return torch.nn.functional.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def perturbed(images: torch.Tensor, seed: int, noise_std: float = NOISE_STD,
              jitter: tuple[float, float, float] = JITTER) -> torch.Tensor:
    """``images`` (N, C, H, W) in [0, 1], :func:`jittered`, plus Gaussian noise, both drawn from ``seed``,
    clipped back to [0, 1]."""
    generator = torch.Generator().manual_seed(seed)
    moved = jittered(images, generator, jitter)
    noise = torch.randn(images.shape, generator=generator, dtype=images.dtype)
    return (moved + noise_std * noise).clamp(0.0, 1.0)


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 256) -> float:
    """Fraction of ``images`` (N, C, H, W) that ``model`` classifies as ``labels`` (N,)."""
    correct = sum(int((model(images[b]).argmax(dim=1) == labels[b]).sum())
                  for b in torch.arange(len(labels)).split(batch_size))
    return correct / len(labels)


def _splits(test_data: Path | None) -> dict[str, torch.Tensor]:
    if test_data is not None:
        return torch.load(test_data, weights_only=True)
    splits = data.load()
    return {"images": splits.test.tensors[0], "labels": splits.test.tensors[1],
            "val_images": splits.val.tensors[0], "val_labels": splits.val.tensors[1]}


def evaluate(path: Path, seed: int, test_data: Path | None = None) -> dict[str, object]:
    """The grader's measurements of the checkpoint at ``path``.

    Args:
        seed: the grader's seed; the noise on the held-out images is drawn from it.
        test_data: a file of ``{"images", "labels"}`` (and optionally ``"val_images", "val_labels"``) the
            grader wrote (saves loading the dataset here); default ``course.data.load()``'s splits.

    Returns:
        ``accuracy`` on the perturbed test split; ``val_accuracy`` on the validation split (None if
        ``test_data`` holds none); ``fingerprint`` of the parameters with the probes' seed; ``digests`` of
        the parameters (:func:`grader.inrank.fingerprints.digests`), in the model's order.

    Raises:
        CheckpointError: see :func:`load_state_dict` and :func:`build_model`.
    """
    model = build_model(load_state_dict(path)).eval()
    split = _splits(test_data)
    val = None  # in one batch, as the probes compute it at report(): the same floating-point sums
    if "val_images" in split:
        val = accuracy(model, split["val_images"], split["val_labels"], batch_size=len(split["val_labels"]))
    return {"accuracy": accuracy(model, perturbed(split["images"], seed), split["labels"]),
            "val_accuracy": val, "fingerprint": fingerprint(list(model.parameters()), probe_seed(seed)),
            "digests": digests(list(model.parameters()))}


def test_accuracy(path: Path, seed: int, test_data: Path | None = None) -> float:
    """Accuracy in [0, 1] of the checkpoint at ``path`` on the perturbed test split (see :func:`evaluate`)."""
    return float(evaluate(path, seed, test_data)["accuracy"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.evaluate")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-data", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        print(json.dumps(evaluate(args.checkpoint, args.seed, args.test_data)))
    except CheckpointError as error:
        print(json.dumps({"error": str(error)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
