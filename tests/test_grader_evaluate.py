"""grader.evaluate: the grader's own scoring of a checkpoint, on a noisy held-out copy the seed decides."""

import json

import pytest
import torch

from course import data, models
from grader import evaluate, harness, probes

pytestmark = pytest.mark.unit6


def test_the_noise_depends_on_the_seed_only_and_keeps_pixels_in_range():
    images = data.load().test.tensors[0]
    a, b, c = evaluate.perturbed(images, 1), evaluate.perturbed(images, 1), evaluate.perturbed(images, 2)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, images)
    assert a.min() >= 0 and a.max() <= 1 and (a - images).abs().mean() < 0.1


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
