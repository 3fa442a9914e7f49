"""course.model_parallel.pipeline: on 4 ranks GPipe and 1F1B give one device's gradients, run the planned ops in
order, and hold m micro-batches (GPipe) or at most p - stage (1F1B), in measured bytes too."""

import pytest
import torch

from course.model_parallel import pipeline, schedules, transformer
from course.runtime.launch import in_turn, launch

pytestmark = pytest.mark.unit8  # notebook 08, though the folder is notebook 03's

CONFIG = transformer.Config(num_layers=4)
P, M, BATCH_SIZE = 4, 8, 8


@pytest.fixture(scope="module")
def runs():
    calls = [(pipeline.step_on_rank, (CONFIG, name, M, BATCH_SIZE)) for name in ("gpipe", "1f1b")]
    by_rank = launch(in_turn, P, *calls, timeout_s=180)
    return {name: [rank[k] for rank in by_rank] for k, name in enumerate(("gpipe", "1f1b"))}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gradients_and_loss_equal_one_device(runs, name):
    full = transformer.build(CONFIG)
    inputs, targets = transformer.sample_batch(CONFIG, BATCH_SIZE)
    expected_loss = transformer.loss(full(inputs), targets).item()
    names = set()
    for result in runs[name]:
        assert max(result["grad_error"].values()) < 1e-5
        names |= set(result["grad_error"])
    assert names == {n for n, _ in full.named_parameters()}  # every parameter lives on exactly one stage
    assert runs[name][-1]["record"].loss == pytest.approx(expected_loss, rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_each_rank_runs_its_schedule_in_order(runs, name):
    for stage, result in enumerate(runs[name]):
        planned = [str(op) for op in schedules.SCHEDULES[name](P, M, stage)]
        assert result["ops"] == result["record"].ops == planned


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpipe_holds_m_micro_batches_and_1f1b_at_most_p(runs):
    for stage in range(P):
        gpipe, one_f_one_b = runs["gpipe"][stage]["record"], runs["1f1b"][stage]["record"]
        assert max(gpipe.in_flight) == M
        assert max(one_f_one_b.in_flight) == P - stage <= P
        # every micro-batch keeps the same bytes, so the measured peaks are in the same ratio
        assert max(gpipe.held_bytes) * (P - stage) == max(one_f_one_b.held_bytes) * M
        assert gpipe.held_bytes[-1] == one_f_one_b.held_bytes[-1] == 0


def test_split_keeps_every_block_once_and_refuses_too_many_stages():
    model = transformer.build(CONFIG)
    stages = pipeline.split(model, 3)
    assert [list(s.blocks) for s in stages] == [["0"], ["1", "2"], ["3"]]
    x, _ = transformer.sample_batch(CONFIG, 2)
    out = x
    for stage in stages:
        out = stage(out)
    assert torch.allclose(out, model(x), atol=1e-6)
    with pytest.raises(ValueError, match="cannot cut 4 blocks into 5 stages"):
        pipeline.split(model, 5)
