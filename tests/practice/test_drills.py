"""course.practice.drills: each planted bug, run on 2 ranks, is named by the tool the drill teaches."""

import re

import pytest

from course.practice import drills

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
@pytest.mark.parametrize("drill", ["skip", "loading"])  # rank 1 skips the collective; rank 1 is stuck loading data
def test_hang_report_names_rank_1_and_rank_0_waiting_for_it(hang_drills, drill):
    report, _ = hang_drills[drill]
    assert report.startswith("RankTimeout: rank(s) 1 made no progress for 5 s")  # conftest's HANG_WINDOW_S
    assert "rank 0 was waiting for it in all_reduce" in report


@pytest.mark.timeout(300)
def test_detail_debug_names_both_shapes():
    report = drills.run_drill("shapes", debug="DETAIL", timeout_s=120)
    assert "Detected mismatch between collectives" in report
    assert "TensorShape=[4]" in report and "TensorShape=[5]" in report


@pytest.mark.timeout(300)
def test_mismatched_shapes_fail_without_debug_too():
    assert drills.run_drill("shapes", timeout_s=120).startswith("RankFailed")


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match="drill"):
        drills.run_drill("nope")
    with pytest.raises(ValueError, match="DEBUG"):
        drills.run_drill("skip", debug="LOUD")


@pytest.mark.timeout(300)
def test_unused_branch_fails_without_find_unused_and_info_names_the_branch():
    report = drills.run_drill("unused", debug="INFO", timeout_s=120)
    assert "Expected to have finished reduction in the prior iteration" in report
    assert "branch.bias, branch.weight" in report and "trunk" not in report.split("did not receive grad")[1]


@pytest.mark.timeout(300)
def test_unused_branch_trains_with_find_unused_parameters():
    report = drills.run_drill("unused", timeout_s=120, find_unused_parameters=True)
    assert report.startswith("finished without an error")


@pytest.mark.timeout(300)
def test_hang_report_with_a_short_limit_still_names_the_rank_and_its_wait(short_window):
    report = drills.hang_report("skip")
    # the time limit or the progress rule, whichever comes first on this machine's load: both name rank 1
    assert re.match(r"RankTimeout: rank\(s\) 1 (did not finish|made no progress)", report), report
    assert drills.WAITING_MARK in report


def test_hang_report_refuses_a_drill_that_does_not_hang():
    with pytest.raises(ValueError, match="hang drills"):
        drills.hang_report("shapes")


@pytest.mark.timeout(300)
def test_hang_report_of_the_stuck_loader_waits_for_both_flight_records(tmp_path, short_window):
    from course.practice import flight_recorder

    with flight_recorder.recording():
        report = drills.hang_report("loading", first_limit_s=10, record_dir=str(tmp_path))
    assert drills.WAITING_MARK in report
    assert all((tmp_path / f"rank{rank}.json").exists() for rank in range(2))
