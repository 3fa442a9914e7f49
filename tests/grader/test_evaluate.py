"""grader.evaluate: the grader's own scoring of a checkpoint, on a jittered, noisy held-out copy the seed decides."""

import json

import pytest
import torch

from course import data, models
from grader import evaluate
from grader.inrank import harness, probes

pytestmark = pytest.mark.unit6


def test_the_noise_depends_on_the_seed_only_and_keeps_pixels_in_range():
    images = data.load().test.tensors[0]
    a, b, c = evaluate.perturbed(images, 1), evaluate.perturbed(images, 1), evaluate.perturbed(images, 2)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, images)
    assert a.min() >= 0 and a.max() <= 1 and (a - images).abs().mean() < 0.1


def test_the_held_out_digits_are_moved_not_only_noised():
    """Noise alone leaves each digit where the public dataset has it; the seeded jitter moves it."""
    images = data.load().test.tensors[0]
    unmoved = evaluate.perturbed(images, 3, noise_std=0.0, jitter=(0.0, 0.0, 0.0))
    torch.testing.assert_close(unmoved, images)  # no jitter, no noise: the identity resampling
    moved = evaluate.perturbed(images, 3, noise_std=0.0)
    centre = torch.arange(8, dtype=torch.float32)

    def centroids(x):  # (N, 2): each image's centre of mass, rows and columns
        mass = x.sum(dim=(1, 2, 3))
        return torch.stack([(x.sum(dim=(1, 3)) * centre).sum(1) / mass, (x.sum(dim=(1, 2)) * centre).sum(1) / mass], 1)

    shift = (centroids(moved) - centroids(images)).abs()
    assert 0.02 < shift.mean() < evaluate.JITTER[2] and torch.equal(moved, evaluate.perturbed(images, 3, noise_std=0.0))


def test_the_checkpoint_digests_are_the_probes_digests(tmp_path):
    model = models.DigitsCNN()
    torch.save(model.state_dict(), tmp_path / "checkpoint.pt")
    verdict = evaluate.evaluate(tmp_path / "checkpoint.pt", seed=5)
    assert verdict["digests"] == probes.digests(list(model.parameters()))


def test_a_checkpoint_is_scored_with_its_fingerprint_and_validation_accuracy(tmp_path, capsys):
    model = models.DigitsCNN()
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "checkpoint.pt")
    assert evaluate.main([str(tmp_path / "checkpoint.pt"), "--seed", "5"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert 0 <= verdict["accuracy"] <= 1 and 0 <= verdict["val_accuracy"] <= 1
    assert verdict["fingerprint"] == probes.fingerprint(list(model.parameters()), harness.probe_seed(5))


def test_an_unloadable_checkpoint_is_an_error_not_a_traceback(tmp_path, capsys):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert evaluate.main([str(tmp_path / "checkpoint.pt")]) == 0
    assert "weights_only" in json.loads(capsys.readouterr().out)["error"]
