"""The two hang drills, each run once per session with the flight recorder on, read by the drill and the
flight-recorder tests (a hang costs its start and a window with no progress: the tests share it rather than wait
twice)."""

from pathlib import Path

import pytest

from course.practice import drills, flight_recorder
from course.runtime import progress

#: Seconds with no progress that end a hang here (20 s in use): the verdict is the same, sooner. A rank still
#: starting on a loaded machine uses processor time, so it is not called stuck, whatever the window.
HANG_WINDOW_S = 5.0
HANG_LIMIT_S = 55.0  # past the window that ends a hang (course.runtime.progress), below the drills' 60 s of sleep


@pytest.fixture(scope="session")
def hang_drills(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """``{"skip": (report, record_dir), "loading": (report, record_dir)}``."""
    runs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress, "WINDOW_S", HANG_WINDOW_S)
        for name in ("skip", "loading"):
            folder = tmp_path_factory.mktemp(f"record-{name}")
            with flight_recorder.recording():  # stopped once neither rank makes progress for the window
                report = drills.run_drill(name, timeout_s=HANG_LIMIT_S, record_dir=str(folder))
            runs[name] = (report, folder)
    return runs
