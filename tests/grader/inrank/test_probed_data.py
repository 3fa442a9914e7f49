"""grader.inrank.probed_data: the training samples a model consumes are named by content, however the batch was
made (indexed by hand, normalized, another dtype), and nothing else is taken for one."""

import pytest
import torch

from course import data
from grader.inrank.probed_data import Catalogue, TrainedBatches

pytestmark = pytest.mark.unit6


@pytest.fixture(scope="module")
def splits():
    return data.load()


def test_a_batch_indexed_by_hand_and_normalized_is_named_sample_by_sample(splits):
    images = splits.train.tensors[0]
    catalogue = Catalogue(images)
    index = torch.randperm(len(images), generator=torch.Generator().manual_seed(3))[:64]
    assert catalogue.lookup(images[index]) == index.tolist()
    assert catalogue.lookup(((images[index] - 0.5) / 0.25).to(torch.float64)) == index.tolist()


def test_what_is_not_training_samples_is_not_named(splits):
    catalogue = Catalogue(splits.train.tensors[0])
    assert catalogue.lookup(splits.val.tensors[0][:32]) is None  # held-out samples
    assert catalogue.lookup(torch.rand(32, 1, 8, 8)) is None  # activations of the same size
    assert catalogue.lookup(torch.rand(32, 16, 4, 4)) is None  # of another size
    noisy = splits.train.tensors[0][:32] + 0.05 * torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    assert catalogue.lookup(noisy) is None  # augmented: the DataLoader's batches count instead


def test_without_a_dataloader_the_step_takes_what_the_model_consumed_once(splits):
    batches = TrainedBatches()
    batches.catalogue = Catalogue(splits.train.tensors[0])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    batch = splits.train.tensors[0][[5, 9, 2]]
    batches.forward(model, (batch,))
    batches.forward(model[0], (batch.clone(),))  # the model's first layer sees the same batch: counted once
    assert batches.take() == ([5, 9, 2], None)
    assert batches.take() == ([], None)  # afresh after a step
