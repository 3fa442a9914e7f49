"""The two hang drills, each run once per session with the flight recorder on, read by the drill and the
flight-recorder tests (a hang costs its start and 20 s with no progress: the tests share it rather than wait twice)."""

from pathlib import Path

import pytest

from course.practice import drills, flight_recorder

HANG_LIMIT_S = 55.0  # past the 20 s with no progress that ends a hang (course.runtime.progress), below the drills'
# 60 s of sleep; a rank still starting on a loaded machine uses processor time, so it is not called stuck


@pytest.fixture(scope="session")
def hang_drills(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """``{"skip": (report, record_dir), "loading": (report, record_dir)}``."""
    runs = {}
    for name in ("skip", "loading"):
        folder = tmp_path_factory.mktemp(f"record-{name}")
        with flight_recorder.recording():  # stopped once neither rank makes progress for 20 s, before the limit
            report = drills.run_drill(name, timeout_s=HANG_LIMIT_S, record_dir=str(folder))
        runs[name] = (report, folder)
    return runs
