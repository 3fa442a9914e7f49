"""course.hello: every rank reports and checks an all-reduce against the closed form; fail_on fails one rank."""

import pytest
import torch
import torch.distributed as dist
from groups import single_rank_group
from processes import live_children

from course import world
from course.hello import fail_on, hello
from course.runtime.launch import RankFailed, launch

pytestmark = pytest.mark.unit0


@pytest.mark.slow
def test_four_ranks_report_themselves_and_agree_on_the_sum(capsys):
    reports = launch(hello, 4, timeout_s=120)
    hardware = world.detect_hardware()
    assert [(r["rank"], r["world_size"], r["backend"], r["device"]) for r in reports] == [
        (rank, 4, hardware.backend, str(world.device_for(rank, hardware))) for rank in range(4)]
    assert all(r["reduced"] == r["expected"] == sum(range(1, 5)) for r in reports)
    printed = sorted(line for line in capsys.readouterr().out.splitlines() if line.startswith("[rank "))
    assert [line.split("]")[0] for line in printed] == [f"[rank {rank}" for rank in range(4)]
    assert all("all_reduce gave 10, expected 10" in line for line in printed)


def test_one_rank_reduces_to_its_own_value():
    with single_rank_group():
        report = hello()
    assert (report["rank"], report["world_size"], report["reduced"], report["expected"]) == (0, 1, 1.0, 1.0)


def test_a_wrong_all_reduce_is_caught(monkeypatch):
    def doubling_all_reduce(tensor: torch.Tensor, op=None) -> None:  # a broken collective
        tensor.mul_(2)

    monkeypatch.setattr(dist, "all_reduce", doubling_all_reduce)
    with single_rank_group(), pytest.raises(RuntimeError, match=r"rank 0: all_reduce returned 2.0, expected 1.0"):
        hello()


@pytest.mark.slow
def test_fail_on_fails_the_chosen_rank_and_launch_names_it():
    with pytest.raises(RankFailed) as caught:
        launch(fail_on, 3, 1, timeout_s=60)
    assert caught.value.rank == 1
    assert "RuntimeError: rank 1 ran out of patience" in str(caught.value)
    assert live_children() == []
