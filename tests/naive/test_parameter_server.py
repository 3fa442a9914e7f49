"""course.naive.parameter_server: the synchronous server equals data-parallel SGD; traffic matches the closed form."""

import naive_ranks
import pytest
import torch
from groups import single_rank_group

from course.models import DigitsCNN
from course.naive import parameter_server as ps


def test_server_traffic_grows_with_workers_and_allreduce_traffic_does_not():
    assert ps.server_bytes_per_step(100, 80, 3) == (300, 240)
    assert ps.allreduce_bytes_per_rank(100, 4) == pytest.approx(150.0)  # 2(n-1)/n = 1.5
    assert ps.allreduce_bytes_per_rank(100, 64) < 200 < ps.server_bytes_per_step(100, 100, 2)[0] + 1
    with pytest.raises(ValueError, match="num_workers must be a positive integer number of workers"):
        ps.server_bytes_per_step(100, 100, 0)


@pytest.fixture(scope="module")
def report():
    return [rank["ps"] for rank in naive_ranks.report()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sync_server_equals_allreduce_data_parallel(report):
    server = report[0]
    assert torch.allclose(server["sync"]["params"], report[0]["allreduce_params"], atol=1e-6)
    assert server["sync"]["losses"] == pytest.approx(report[0]["allreduce"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_traffic_is_exactly_the_closed_form(report):
    steps, workers = naive_ranks.PS.steps, naive_ranks.WORLD_SIZE - 1
    g, p = report[0]["gradient_bytes"], report[0]["parameter_bytes"]
    into, out = ps.server_bytes_per_step(g, p, workers)
    loss_bytes = 4 * workers  # each push also carries the worker's float32 loss
    assert (report[0]["sync"]["bytes_in"], report[0]["sync"]["bytes_out"]) == (steps * (into + loss_bytes), steps * out)
    for worker in report[1:]:
        assert (worker["sync"]["bytes_in"], worker["sync"]["bytes_out"]) == (steps * p, steps * (g + 4))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_async_server_applies_every_gradient_with_measured_staleness(report):
    steps, workers = naive_ranks.PS.steps, naive_ranks.WORLD_SIZE - 1
    run = report[0]["async"]
    assert sorted(run["senders"]) == sorted(list(range(1, workers + 1)) * steps)
    assert len(run["staleness"]) == steps * workers and min(run["staleness"]) >= 0
    assert sum(run["staleness"]) > 0  # three workers, one a straggler: some gradients arrive late
    assert all(rank["async"]["losses"] == [] for rank in report[1:])


def test_modelled_step_time_server_grows_linearly_ring_stays_flat():
    from course.collectives.cost_model import AlphaBeta, predict

    link = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
    times = {w: ps.modelled_seconds_per_step(10**6, w, link) for w in (1, 2, 8, 64)}
    assert times[8]["parameter server"] == pytest.approx(8 * times[1]["parameter server"])
    assert times[1]["parameter server"] == pytest.approx(2 * (1e-5 + 1e-3))
    assert times[1]["ring allreduce"] == 0.0
    assert times[64]["ring allreduce"] == pytest.approx(predict("ring", 10**6, 64, link))
    bandwidth_only = AlphaBeta(alpha_s=0.0, beta_s_per_byte=1e-9)  # ring bytes per link: 2(n-1)/n < 2 for any n
    ring = [ps.modelled_seconds_per_step(10**6, w, bandwidth_only)["ring allreduce"] for w in (2, 64)]
    assert ring[0] == pytest.approx(1e-3) and ring[1] == pytest.approx(2 * 63 / 64 * 1e-3)


def test_a_server_without_workers_is_refused():
    with single_rank_group():
        batches = [(torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.int64))]
        for run in (ps.run_sync, ps.run_async):
            with pytest.raises(ValueError, match="world_size >= 2, got 1"):
                run(DigitsCNN(width=4), batches, 0.1)
