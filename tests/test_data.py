"""course.data: the embedded digits, and the user's own Fashion-MNIST / CIFAR-10 with clear errors."""

import gzip
import pickle
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course import data

pytestmark = pytest.mark.unit0


def _indices(dataset) -> set[bytes]:
    return {image.numpy().tobytes() + bytes([label]) for image, label in zip(*dataset.tensors, strict=True)}


def test_digits_are_split_1197_300_300_with_images_in_unit_range():
    splits = data.load()
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1197, 300, 300)
    assert splits.input_shape == (1, 8, 8) and splits.num_classes == 10
    images = splits.train.tensors[0]
    assert images.dtype == torch.float32 and images.min() >= 0 and images.max() <= 1
    assert set(splits.train.tensors[1].tolist()) == set(range(10))


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_splits_are_deterministic_disjoint_and_cover_every_digit(seed):
    first, again = data.load(seed=seed), data.load(seed=seed)
    assert torch.equal(first.test.tensors[0], again.test.tensors[0])
    train, val, test = (_indices(s) for s in (first.train, first.val, first.test))
    assert not (train & val) and not (train & test) and not (val & test)
    everything = data.load_digits(seed=seed, n_val=0, n_test=0).train
    assert train | val | test == _indices(everything)


def test_different_seeds_give_different_splits():
    assert not torch.equal(data.load(seed=0).test.tensors[1], data.load(seed=1).test.tensors[1])


def _write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("compress", [False, True])
def test_fashion_mnist_reads_idx_files(tmp_path, compress):
    suffix = ".gz" if compress else ""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 20)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, 28, 28)), compress)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, compress)
    splits = data.load_fashion_mnist(tmp_path, n_val=10)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (50, 10, 20)
    assert splits.input_shape == (1, 28, 28)
    assert splits.test.tensors[1].tolist() == [i % 10 for i in range(20)]


def test_fashion_mnist_errors_name_the_file_and_the_format(tmp_path):
    with pytest.raises(data.DatasetError, match="train-images-idx3-ubyte.*not found"):
        data.load("fashion-mnist", root=tmp_path)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"not an idx file")
    with pytest.raises(data.DatasetError, match="train-images-idx3-ubyte is not an unsigned-byte IDX file"):
        data.load("fashion-mnist", root=tmp_path)
    _write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((5, 28, 28)), False)
    with open(tmp_path / "train-images-idx3-ubyte", "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(data.DatasetError, match="truncated"):
        data.load("fashion-mnist", root=tmp_path)
    with pytest.raises(data.DatasetError, match="is not a directory"):
        data.load("fashion-mnist", root=tmp_path / "nowhere")
    with pytest.raises(data.DatasetError, match="needs root="):
        data.load("fashion-mnist")


def test_an_idx_header_cut_short_is_named(tmp_path):
    (tmp_path / "train-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">I", 5))
    with pytest.raises(data.DatasetError, match=r"train-images-idx3-ubyte is truncated inside its header: .* "
                                                r"starts with 16 bytes .*, found 8"):
        data.load("fashion-mnist", root=tmp_path)


def test_a_gz_file_that_is_not_gzip_is_named(tmp_path):
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((5, 28, 28)), compress=False)
    with pytest.raises(data.DatasetError, match=r"train-images-idx3-ubyte.gz is not a gzip file.*drop the .gz"):
        data.load("fashion-mnist", root=tmp_path)


def test_a_truncated_gz_file_is_named(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    _write_idx(path, np.random.default_rng(0).integers(0, 256, (50, 28, 28)), compress=True)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(data.DatasetError, match=r"train-images-idx3-ubyte.gz is a damaged or truncated gzip file"):
        data.load("fashion-mnist", root=tmp_path)


def _write_cifar(path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(range(n))}
    path.write_bytes(pickle.dumps(batch))


def test_cifar10_reads_python_batches(tmp_path):
    for i in range(1, 6):
        _write_cifar(tmp_path / f"data_batch_{i}", 4, i)
    _write_cifar(tmp_path / "test_batch", 3, 0)
    splits = data.load_cifar10(tmp_path, n_val=5)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (15, 5, 3)
    assert splits.test.tensors[1].tolist() == [0, 1, 2]
    assert splits.test.tensors[0].shape == (3, 3, 32, 32)


def test_cifar10_errors_name_the_file(tmp_path):
    with pytest.raises(data.DatasetError, match="data_batch_1 not found"):
        data.load("cifar10", root=tmp_path)
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({"wrong": 1}))
    with pytest.raises(data.DatasetError, match="data_batch_1 is not a CIFAR-10 python batch"):
        data.load("cifar10", root=tmp_path)
    batch = {b"data": np.zeros((4, 3072), dtype=np.uint8), b"labels": [0, 1, 2]}
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(batch))
    with pytest.raises(data.DatasetError, match="data_batch_1 holds 4 images but 3 labels"):
        data.load("cifar10", root=tmp_path)


def test_a_split_larger_than_the_data_is_refused(tmp_path):
    for i in range(1, 6):
        _write_cifar(tmp_path / f"data_batch_{i}", 4, i)
    _write_cifar(tmp_path / "test_batch", 3, 0)
    with pytest.raises(data.DatasetError, match=r"only 20 samples.*pass a smaller n_val / n_test to data.load"):
        data.load("cifar10", root=tmp_path)
    splits = data.load("cifar10", root=tmp_path, n_val=6)  # the fix the message gives
    assert (len(splits.train), len(splits.val), len(splits.test)) == (14, 6, 3)
    with pytest.raises(data.DatasetError, match="cifar10 comes with its own test set, so n_test=5 cannot apply"):
        data.load("cifar10", root=tmp_path, n_val=6, n_test=5)


def test_load_passes_split_sizes_to_the_digits():
    splits = data.load(seed=3, n_val=100, n_test=50)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1647, 100, 50)
    reference = data.load_digits(seed=3, n_val=100, n_test=50)
    assert torch.equal(splits.test.tensors[0], reference.test.tensors[0])


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_split_sizes_must_be_whole_numbers(bad):
    with pytest.raises(data.DatasetError, match=f"n_val must be an integer >= 0, got {bad!r}"):
        data.load(n_val=bad)


def test_a_root_for_the_digits_is_refused_with_the_fix(tmp_path):
    with pytest.raises(data.DatasetError, match="digits ship with scikit-learn.*name='fashion-mnist'"):
        data.load(root=tmp_path)


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(data.DatasetError, match="choose one of digits, fashion-mnist, cifar10"):
        data.load("imagenet")


@pytest.mark.parametrize("bad", [0, -3, 2.0, None, True])
def test_loader_refuses_bad_batch_sizes(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        data.loader(data.load().val, batch_size=bad)


def test_loader_order_is_fixed_by_seed():
    val = data.load().val
    first = [labels.tolist() for _, labels in data.loader(val, 32, seed=3)]
    again = [labels.tolist() for _, labels in data.loader(val, 32, seed=3)]
    other = [labels.tolist() for _, labels in data.loader(val, 32, seed=4)]
    assert first == again and first != other


def test_global_batches_are_the_seeded_loader_cycling_its_epochs():
    val = data.load().val  # 300 samples: 2 full batches of 128 per epoch (the rest dropped)
    batches = data.global_batches(val, 128, steps=5, seed=7)
    epochs = [list(data.loader(val, 128, seed=7 + epoch, drop_last=True)) for epoch in range(3)]
    expected = [batch for epoch in epochs for batch in epoch][:5]
    assert len(batches) == 5 and all(len(x) == len(y) == 128 for x, y in batches)
    for (x, y), (want_x, want_y) in zip(batches, expected, strict=True):
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
    assert not torch.equal(batches[0][1], batches[2][1])  # the second epoch is reshuffled


def test_global_batches_refuse_a_bad_step_count():
    with pytest.raises(ValueError, match="steps must be a positive integer number of batches, got 0"):
        data.global_batches(data.load().val, 8, 0)


def test_tensors_are_the_dataset_tensors_on_the_device():
    val = data.load().val
    inputs, targets = data.tensors(val, torch.device("cpu"))
    assert torch.equal(inputs, val.tensors[0]) and torch.equal(targets, val.tensors[1])


def test_digits_read_directly_equal_scikit_learns():
    from sklearn.datasets import load_digits as sklearn_digits

    pixels, targets = data._digits_table()
    bunch = sklearn_digits()
    assert np.array_equal(pixels, bunch.data) and np.array_equal(targets, bunch.target)
    assert torch.equal(data.load_digits(n_val=0, n_test=0).train.tensors[0].flatten(1).sort(0).values,
                       torch.tensor(bunch.data / 16.0, dtype=torch.float32).sort(0).values)
