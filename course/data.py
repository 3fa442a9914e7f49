"""Datasets: the embedded handwritten digits by default, your own Fashion-MNIST or CIFAR-10 if you have them.

The default ships inside scikit-learn (1,797 grey 8x8 images of the digits 0-9), so the course runs with
no download. Splits are deterministic: the same seed gives the same train / validation / test samples on
every machine and every rank. Taught in ``notebooks/00_start_here.ipynb`` and used everywhere.

    splits = data.load()                         # digits
    splits = data.load("fashion-mnist", root="~/data/fashion")   # IDX files you downloaded yourself
    train_loader = data.loader(splits.train, batch_size=64)
    batches = data.global_batches(splits.train, global_batch_size=256, steps=40)   # the same on every rank
"""

from __future__ import annotations

import gzip
import pickle
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from course import world
from course.arguments import check_count

DATASETS = ("digits", "fashion-mnist", "cifar10")


class DatasetError(ValueError):
    """A dataset path is missing or a file is not in the expected format."""


@dataclass(frozen=True)
class Splits:
    """Train, validation and test sets of ``(image, label)`` pairs.

    Attributes:
        train, val, test: datasets of float images ``(C, H, W)`` in [0, 1] and int64 labels.
        num_classes: number of labels.
        name: which dataset this is.
    """

    train: TensorDataset
    val: TensorDataset
    test: TensorDataset
    num_classes: int
    name: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one image, ``(C, H, W)``."""
        return tuple(self.train.tensors[0].shape[1:])


def _split(images: torch.Tensor, labels: torch.Tensor, n_val: int, n_test: int, seed: int
           ) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    for what, size in (("n_val", n_val), ("n_test", n_test)):
        try:
            check_count(what, size, minimum=0)
        except ValueError as error:
            raise DatasetError(str(error)) from None
    if n_val + n_test >= len(labels):
        raise DatasetError(
            f"only {len(labels)} samples, but {n_val} are asked for validation and {n_test} for test; "
            "leave some for training (pass a smaller n_val / n_test to data.load)."
        )
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test, val, train = order[:n_test], order[n_test:n_test + n_val], order[n_test + n_val:]
    return tuple(TensorDataset(images[idx], labels[idx]) for idx in (train, val, test))


def load_digits(seed: int = 0, n_val: int = 300, n_test: int = 300) -> Splits:
    """scikit-learn's 1,797 handwritten digits as ``(1, 8, 8)`` images, split deterministically by ``seed``."""
    pixels, targets = _digits_table()
    images = torch.tensor(pixels.reshape(-1, 8, 8) / 16.0, dtype=torch.float32).unsqueeze(1)  # (N, 1, 8, 8)
    labels = torch.tensor(targets, dtype=torch.int64)
    train, val, test = _split(images, labels, n_val, n_test, seed)
    return Splits(train, val, test, num_classes=10, name="digits")


def _digits_table() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels ``(1797, 64)`` and labels ``(1797,)``, read from the file scikit-learn ships.

    Read directly, as ``sklearn.datasets.load_digits`` reads it, because importing scikit-learn costs about a
    second of CPU in every rank that loads the data (notebook 05 starts about 15 such processes).
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.exists():  # another layout: let scikit-learn find its own file
        from sklearn.datasets import load_digits as sklearn_digits

        bunch = sklearn_digits()
        return bunch.data, bunch.target
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed if its name ends in ``.gz``."""
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read()
    except gzip.BadGzipFile:
        raise DatasetError(f"{path} is not a gzip file, though its name ends in .gz: expected a gzipped IDX file. "
                           "Decompress it yourself and drop the .gz, or download it again.") from None
    except (EOFError, zlib.error) as error:
        raise DatasetError(f"{path} is a damaged or truncated gzip file ({error}): expected a complete gzipped IDX "
                           "file. Download it again.") from None


def _find(root: Path, stem: str, expected: str) -> Path:
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"{root / stem}(.gz) not found: expected {expected} in {root}.")


def read_idx(path: Path, expected_dims: int) -> np.ndarray:
    """Read an IDX file (the MNIST format: magic, dimension sizes, then unsigned bytes), gzipped or not."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DatasetError(f"{path} is not an unsigned-byte IDX file (it should start with 00 00 08).")
    dims = raw[3]
    if dims != expected_dims:
        raise DatasetError(f"{path} has {dims} dimension(s); expected {expected_dims}.")
    if len(raw) < 4 + 4 * dims:
        raise DatasetError(f"{path} is truncated inside its header: an IDX file with {dims} dimension(s) starts "
                           f"with {4 + 4 * dims} bytes (magic, then one 4-byte size per dimension), found {len(raw)}.")
    shape = struct.unpack(f">{dims}I", raw[4:4 + 4 * dims])
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise DatasetError(f"{path} is truncated: header says {shape}, found {body.size} bytes of data.")
    return body.reshape(shape)


def load_fashion_mnist(root: str | Path, seed: int = 0, n_val: int = 5000) -> Splits:
    """Fashion-MNIST from the four IDX files (``train-images-idx3-ubyte`` etc., optionally ``.gz``) in ``root``."""
    root = _existing_dir(root, "Fashion-MNIST IDX files")
    arrays = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_find(root, f"{prefix}-images-idx3-ubyte", "an IDX image file"), 3)
        labels = read_idx(_find(root, f"{prefix}-labels-idx1-ubyte", "an IDX label file"), 1)
        if len(images) != len(labels):
            raise DatasetError(f"{root}: {len(images)} {split} images but {len(labels)} labels.")
        arrays[split] = (torch.tensor(images / 255.0, dtype=torch.float32).unsqueeze(1),
                         torch.tensor(labels, dtype=torch.int64))
    train, val, _ = _split(*arrays["train"], n_val=n_val, n_test=0, seed=seed)
    return Splits(train, val, TensorDataset(*arrays["test"]), num_classes=10, name="fashion-mnist")


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DatasetError(f"{path} not found: expected the CIFAR-10 python batches in {path.parent}.")
    try:
        with open(path, "rb") as handle:
            # The CIFAR-10 python format is a pickle; this reads the user's own local copy, nothing remote.
            batch = pickle.load(handle, encoding="bytes")
        images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError, TypeError) as error:
        raise DatasetError(
            f"{path} is not a CIFAR-10 python batch (a pickled dict with b'data' of shape (N, 3072) and "
            f"b'labels'): {error}"
        ) from None
    if len(images) != len(labels):
        raise DatasetError(f"{path} holds {len(images)} images but {len(labels)} labels: a CIFAR-10 python batch has "
                           "one label per row of b'data'. Download the batch again.")
    return images, labels


def load_cifar10(root: str | Path, seed: int = 0, n_val: int = 5000) -> Splits:
    """CIFAR-10 from ``data_batch_1``..``data_batch_5`` and ``test_batch`` (the python version) in ``root``."""
    root = _existing_dir(root, "the CIFAR-10 python batches (cifar-10-batches-py)")
    parts = [_cifar_batch(root / f"data_batch_{i}") for i in range(1, 6)]
    images = torch.tensor(np.concatenate([p[0] for p in parts]) / 255.0, dtype=torch.float32)
    labels = torch.tensor(np.concatenate([p[1] for p in parts]))
    test_images, test_labels = _cifar_batch(root / "test_batch")
    train, val, _ = _split(images, labels, n_val=n_val, n_test=0, seed=seed)
    test = TensorDataset(torch.tensor(test_images / 255.0, dtype=torch.float32), torch.tensor(test_labels))
    return Splits(train, val, test, num_classes=10, name="cifar10")


def _existing_dir(root: str | Path | None, what: str) -> Path:
    if root is None:
        raise DatasetError(f"this dataset needs root=<directory holding {what}>; nothing is downloaded.")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DatasetError(f"{path} is not a directory: expected a directory holding {what}.")
    return path


def load(name: str = "digits", root: str | Path | None = None, seed: int = 0, n_val: int | None = None,
         n_test: int | None = None) -> Splits:
    """Load a dataset by name: ``digits`` (embedded), ``fashion-mnist`` or ``cifar10`` (from ``root``).

    Args:
        root: the directory holding your own Fashion-MNIST or CIFAR-10 files; the digits take none.
        seed: fixes which samples go to which split.
        n_val: validation samples taken from the training data (default 300 for the digits, 5000 otherwise).
        n_test: test samples, for the digits only (default 300); the other datasets come with their own test set.

    Raises:
        DatasetError: unknown name, missing directory or file, a file in the wrong format, a split that leaves
            nothing to train on, or an argument the dataset does not take.
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}.")
    if name == "digits":
        if root is not None:
            raise DatasetError(f"the digits ship with scikit-learn and are never read from a directory, but "
                               f"root={str(root)!r} was given. Drop root=, or pass name='fashion-mnist' or "
                               "name='cifar10' to load your own files from it.")
        return load_digits(seed=seed, n_val=300 if n_val is None else n_val, n_test=300 if n_test is None else n_test)
    if n_test is not None:
        raise DatasetError(f"{name} comes with its own test set, so n_test={n_test!r} cannot apply; drop n_test= "
                           "(n_val= sets how many training samples are held out for validation).")
    reader = load_fashion_mnist if name == "fashion-mnist" else load_cifar10
    return reader(root, seed=seed, n_val=5000 if n_val is None else n_val)


def loader(dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 0, **kwargs) -> DataLoader:
    """A DataLoader whose shuffling order is fixed by ``seed``.

    Args:
        batch_size: samples per batch, per rank when the loader feeds one rank.

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
    """
    batch_size = check_count("batch_size", batch_size, unit="number of samples")
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, **kwargs)


def global_batches(dataset: Dataset, global_batch_size: int, steps: int, seed: int = 0
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``steps`` global batches of a seeded shuffled :func:`loader` (cycling epochs): the same on every
    rank, each rank then taking its shard (:func:`course.data_parallel.split_batch`).

    Args:
        global_batch_size: samples per batch, all ranks (replicas) together. steps: number of batches.

    Raises:
        ValueError: ``global_batch_size`` or ``steps`` not a positive integer.
    """
    steps = check_count("steps", steps, unit="number of batches")
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    epoch = 0
    while len(batches) < steps:
        batches += list(loader(dataset, global_batch_size, shuffle=True, seed=seed + epoch, drop_last=True))
        epoch += 1
    return batches[:steps]


def tensors(dataset: TensorDataset, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A TensorDataset's ``(inputs, targets)`` on ``device`` (rank 0's device by default), for training on
    whole tensors without a loader (``notebooks/02_large_batch.ipynb``)."""
    device = device or world.device_for(0)
    inputs, targets = dataset.tensors
    return inputs.to(device), targets.to(device)
