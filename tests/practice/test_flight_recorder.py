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


def _torch_library_text() -> bytes:
    """The installed torch's libraries and its c10d headers (a CPU build has no NCCL code, only its headers)."""
    import torch

    root = os.path.dirname(torch.__file__)
    lib, c10d = os.path.join(root, "lib"), os.path.join(root, "include", "torch", "csrc", "distributed", "c10d")
    files = [os.path.join(lib, name) for name in os.listdir(lib) if ".so" in name or name.endswith(".dll")]
    files += [os.path.join(c10d, name) for name in os.listdir(c10d) if name.endswith(".hpp")]
    return b"".join(open(path, "rb").read() for path in files)


def test_every_nccl_setting_the_course_teaches_is_a_name_the_installed_torch_reads():
    """Issue 33, item 3: the names must be torch's own, or a job sets them and records nothing."""
    library = _torch_library_text()
    names = list(flight_recorder.NCCL_SETTINGS) + list(flight_recorder.NCCL_OLDER_NAMES.values())
    missing = [name for name in names if name.encode() not in library]
    assert not missing, f"torch's libraries never mention {missing}"


def test_nccl_settings_dump_on_timeout_and_time_each_collective():
    line = flight_recorder.nccl_settings("/tmp/fr_", 500)
    assert "TORCH_FR_BUFFER_SIZE=500" in line and "TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_" in line
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in line and "TORCH_NCCL_ENABLE_TIMING=1" in line
    with pytest.raises(ValueError, match="buffer_size"):
        flight_recorder.nccl_settings(buffer_size=0)


@pytest.mark.parametrize("notebook", ["09_real_gpu_practice.ipynb", "09b_profiling_and_pitfalls.ipynb"])
def test_the_notebooks_name_what_nccl_needs_to_dump_and_time(notebook):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "notebooks" / notebook).read_text()
    assert all(name in text for name in flight_recorder.NCCL_SETTINGS), notebook
