"""Adding an allreduce algorithm is one function and one row of the table (course.collectives.protocol.ALGORITHMS):
a toy algorithm, registered here, runs through the protocol on real ranks and appears wherever the table is read
(the simulation, the cost model, its plot, the performance model)."""

import matplotlib
import numpy as np
import pytest
import torch
import torch.distributed as dist

from course import world
from course.collectives import cost_model, schedules, simulation
from course.collectives.allreduce import ALGORITHMS, begin, finish
from course.collectives.protocol import Algorithm, register
from course.perf import catalog
from course.perf import model as perf_model
from course.runtime.launch import launch

matplotlib.use("Agg")


def direct_allreduce(tensor, op="sum", group=None, *, check=True):
    """The one function: every rank sends its whole tensor to every other rank and adds what it receives."""
    flat, comm, agreement = begin("direct", tensor, op, group, check)
    agreement.verify()
    peers = [peer for peer in range(comm.world_size) if peer != comm.rank]
    incoming = [torch.empty_like(flat) for _ in peers]
    works = [comm.isend(flat, peer) for peer in peers]
    works += [comm.irecv(buffer, peer) for buffer, peer in zip(incoming, peers, strict=True)]
    for work in works:
        work.wait()
    for buffer in incoming:
        flat.add_(buffer)
    return finish(tensor, op, comm)


def direct_schedule(world_size):
    """One step: every rank's whole tensor to every other rank, added on arrival."""
    messages = tuple(schedules.Message(source, dest, schedules.WHOLE)
                     for source in range(world_size) for dest in range(world_size) if dest != source)
    return [schedules.Step("everyone to everyone", messages, add=True)] if messages else []


#: The one row.
DIRECT = Algorithm("direct", direct_allreduce, lambda n: (n - 1, n - 1), direct_schedule)


@pytest.fixture
def direct():
    register(DIRECT)
    yield DIRECT
    del ALGORITHMS["direct"]


def direct_on_ranks():
    """On every rank: register the row, reduce against dist.all_reduce, then disagree with a naive call."""
    register(DIRECT)
    rank = world.current().rank
    mine = torch.arange(7, dtype=torch.float64) * (rank + 1)
    reference = mine.clone()
    dist.all_reduce(reference)
    average = ALGORITHMS["direct"](mine.clone(), op="avg")
    try:
        ALGORITHMS["direct" if rank == 0 else "naive"](torch.ones(3))
        error = "no error"
    except ValueError as raised:
        error = str(raised)
    return {"difference": (average * world.current().world_size - reference).abs().max().item(), "error": error}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_toy_runs_through_the_protocol_on_ranks():
    results = launch(direct_on_ranks, 3, timeout_s=150)
    assert [r["difference"] for r in results] == [0.0, 0.0, 0.0]  # small integers: exact
    for result in results:  # the agreement check named the toy by its row
        assert "direct allreduce" in result["error"] and "naive allreduce" in result["error"], result["error"]


def test_the_toy_appears_where_the_table_is_read(direct):
    inputs = simulation.example_inputs(world_size=4, numel=6)
    played = simulation.simulate("direct", inputs)
    assert np.array_equal(played.snapshots[-1].values, np.tile(sum(inputs), (4, 1)))

    assert cost_model.coefficients("direct", 5) == (4.0, 4.0)
    link = cost_model.AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
    assert cost_model.predict("direct", 1e6, 5, link) == pytest.approx(4 * 1e-5 + 4 * 1e6 * 1e-9)
    labels = [line.get_label() for line in cost_model.plot(5, link).axes[0].get_lines()]
    assert "direct (model)" in labels

    cluster = perf_model.Cluster(next(iter(catalog.GPUS.values())), next(iter(catalog.LINKS.values())))
    assert "direct" in perf_model.schemes()
    assert perf_model.allreduce_seconds(1e6, 4, cluster, "direct") == pytest.approx(
        float(cost_model.predict("direct", 1e6, 4, perf_model.alpha_beta(cluster.intra))))


def test_after_removal_the_toy_is_gone_everywhere():
    assert "direct" not in ALGORITHMS
    with pytest.raises(ValueError, match="algorithm must be one of"):
        cost_model.coefficients("direct", 4)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        simulation.simulate("direct", simulation.example_inputs(world_size=2, numel=2))
