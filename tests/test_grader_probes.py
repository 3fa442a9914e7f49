"""grader.probes: the split is held fixed, calls from outside the probes are reported, fingerprints agree."""

import pytest
import torch

from course import models
from grader import probes

pytestmark = pytest.mark.unit6


class Recorder:
    """Stands in for a channel.Writer: keeps the records."""

    def __init__(self) -> None:
        self.records = []

    def write(self, record):
        self.records.append(record)


@pytest.mark.parametrize("arguments", [{"seed": 1}, {"n_test": 0}, {"n_val": 10}])
def test_another_split_is_refused_with_the_fix(arguments):
    name = next(iter(arguments))
    with pytest.raises(ValueError, match=rf"data.load\({name}=.*held-out samples into training.*without {name}="):
        probes._refuse_other_splits("load", arguments)


def test_the_default_split_is_allowed():
    probes._refuse_other_splits("load", {"name": "digits", "seed": 0})
    probes._refuse_other_splits("load_digits", {})


def test_the_wrapped_loader_refuses_another_seed_and_hides_the_test_split():
    from course import data

    probe = probes.Probes(Recorder(), rank=0, seed=1)
    probe._wrap_data()
    try:
        with pytest.raises(ValueError, match="seed=1"):
            data.load(seed=1)
        with pytest.raises(ValueError, match="n_test=0"):
            data.load_digits(0, 300, 0)
        splits = data.load()
        assert isinstance(splits.train, probes.ProbedDataset) and len(splits.test) == 0 and len(splits.val) == 300
    finally:
        for key, original in probe._originals.items():
            setattr(data, key.rsplit(".", 1)[1], original)


def test_emit_from_outside_the_probes_is_written_as_a_forgery():
    writer = Recorder()
    probe = probes.Probes(writer, rank=0, seed=1)
    probe.emit("report", val_accuracy=0.99)
    probe.finish("returned", 0, None)  # the harness's path: emit is called from inside the probes
    forged, end = writer.records
    assert forged["kind"] == "forgery" and forged["forged_kind"] == "report" and "val_accuracy" not in forged
    assert forged["caller"] == __file__
    assert end["kind"] == "end" and end["exit_code"] == 0


def test_the_probes_fingerprint_is_the_module_fingerprint():
    model = models.DigitsCNN()
    params = list(model.parameters())
    probe = probes.Probes(Recorder(), rank=0, seed=7)
    assert probe._fingerprint(params) == probes.fingerprint(params, 7)
    assert probes.fingerprint(params, 7) != probes.fingerprint(params, 8)
    torch.testing.assert_close(probes.fingerprint(params, 7)[-1],
                               float(torch.cat([p.detach().reshape(-1) for p in params]).double().norm()))
