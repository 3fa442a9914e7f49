"""The two hang drills, each run once per session with the flight recorder on, read by the drill and the
flight-recorder tests (a hang costs its whole time limit: the tests share it rather than wait for it twice)."""

from pathlib import Path

import pytest

from course.practice import drills, flight_recorder

HANG_LIMIT_S = 30.0  # the ranks reach their hang in a few seconds, even spawned anew on a loaded machine


@pytest.fixture(scope="session")
def hang_drills(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """``{"skip": (report, record_dir), "loading": (report, record_dir)}``."""
    runs = {}
    for name in ("skip", "loading"):
        folder = tmp_path_factory.mktemp(f"record-{name}")
        for timeout_s in (HANG_LIMIT_S, 3 * HANG_LIMIT_S):  # once more if rank 0 had not reached its wait (load)
            with flight_recorder.recording():
                report = drills.run_drill(name, timeout_s=timeout_s, record_dir=str(folder))
            if "rank 0 was waiting for it" in report:
                break
        runs[name] = (report, folder)
    return runs
