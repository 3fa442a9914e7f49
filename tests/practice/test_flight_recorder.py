"""course.practice.flight_recorder: the record of the skip drill shows which rank never entered the collective."""

import os

import pytest

from course.practice import flight_recorder

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_the_skipping_rank_has_no_all_reduce_in_its_record(hang_drills):
    report, tmp_path = hang_drills["skip"]
    assert report.startswith("RankTimeout")
    waiting, skipping = (flight_recorder.entries(tmp_path / f"rank{r}.json") for r in (0, 1))
    assert [(e["seq"], e["op"], e["sizes"]) for e in waiting] == [(1, "gloo:all_reduce", [[1]])]
    assert skipping == []


@pytest.mark.timeout(300)
def test_the_waiting_rank_is_one_collective_ahead_of_the_stuck_loader(hang_drills):
    report, tmp_path = hang_drills["loading"]
    assert report.startswith("RankTimeout: rank(s) 1")
    waiting, stuck = (flight_recorder.entries(tmp_path / f"rank{r}.json") for r in (0, 1))
    # two batches done (weight and bias gradients each), the third's weight all-reduce entered by rank 0 only
    assert [e["seq"] for e in stuck] == [1, 2, 3, 4]
    assert [e["seq"] for e in waiting] == [1, 2, 3, 4, 5]
    assert waiting[-1]["sizes"] == [[1, 4]]


def test_recording_sets_and_restores_the_buffer_size():
    before = os.environ.get(flight_recorder.BUFFER_ENV)
    with flight_recorder.recording(7):
        assert os.environ[flight_recorder.BUFFER_ENV] == "7"
    assert os.environ.get(flight_recorder.BUFFER_ENV) == before
    with pytest.raises(ValueError, match="buffer_size"), flight_recorder.recording(-1):
        pass
