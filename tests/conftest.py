"""Fixtures shared by the test modules, each test's course unit taken from its folder, and a watchdog that ends a
hung run."""

import faulthandler
import gc
import os
from pathlib import Path

import pytest
from hypothesis import settings

# One thread per process. Two workers, and the ranks they start, already fill the cores. A second torch thread
# only spins waiting for the first on an oversubscribed machine: 3-9x the CPU time for the same small model.
# Set before torch is imported, so that notebook kernels and rank processes inherit it too.
os.environ["OMP_NUM_THREADS"] = "1"
import torch  # noqa: E402

torch.set_num_threads(1)

# No hypothesis deadline anywhere: a verdict must not depend on the machine's load, and an example's first call
# may import or compile what later ones reuse (a 0.48 s first call of a 0.1 ms test failed under load).
settings.register_profile("course", deadline=None)
settings.load_profile("course")

# tests/<folder>/ mirrors course/<folder>/; a module of another unit says so with its own `pytestmark`
UNIT_OF_FOLDER = {"runtime": "unit0", "optimization": "unit2", "naive": "unit3", "model_parallel": "unit3",
                  "collectives": "unit4", "ddp": "unit5", "multinode": "unit5", "perf": "unit5", "monitor": "unit6",
                  "grader": "unit6", "memory": "unit7", "practice": "unit9",
                  "long_context": "unit8b", "experts": "unit8b"}
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m unitN` selects
def pytest_collection_modifyitems(items):
    """Mark every test under tests/<folder>/ with its folder's unit, unless the module names another unit."""
    items.sort(key=_start_order)  # stable: the rest keep their collection order
    for item in items:
        _check_group(item)
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:  # the notebooks (nbval)
            continue
        unit = UNIT_OF_FOLDER.get(folder)
        if unit and not any(mark.name.startswith("unit") for mark in item.iter_markers()):
            item.add_marker(unit)


def pytest_collection_finish(session):
    """Every module the tests import is imported now: the garbage collector need not walk them again at every full
    collection (torch's objects alone made a sixth of a training process's CPU)."""
    gc.freeze()


# -- three workers (make test: pytest-xdist -n 3) ---------------------------------------------------------------------
# Three workers on 2 cores: while one waits (a hang being detected, a process starting), two still compute, and
# beside another job on the machine the suite keeps its share of the cores.
# A worker runs a module's tests together (its module fixtures are made once; a notebook's cells share one kernel),
# and the modules that share a session fixture too costly to make twice all together: one worker makes it.
SHARED = {"graded_submissions": ("grading", ("tests/grader/test_fair_idioms.py", "tests/grader/test_submissions.py")),
          "hang_drills": ("hang drills", ("tests/practice/test_drills.py", "tests/practice/test_flight_recorder.py"))}
GROUP_OF_MODULE = {module: group for group, modules in SHARED.values() for module in modules}
# The longest scopes go out first, longest first, so that none of them starts late and runs alone at the end while
# the other workers wait (the order of a full run's --durations, summed by scope). The rest, each under a minute,
# follow in collection order and fill the gaps.
FIRST = ("grading", "tests/runtime/test_launch.py", "notebooks/05_ddp.ipynb", "tests/grader/sandbox/test_sandbox.py",
         "tests/grader/labs/test_ddp.py", "hang drills", "tests/grader/labs/test_one_f_one_b.py",
         "notebooks/08_tensor_pipeline.ipynb", "tests/test_lab_browser.py", "notebooks/02_large_batch.ipynb",
         "notebooks/09_real_gpu_practice.ipynb", "tests/benchmarks/test_gpu_course_check.py",
         "notebooks/03_naive_multi_gpu.ipynb", "tests/test_autograder_setup.py", "tests/grader/labs/test_fsdp.py",
         "tests/grader/labs/test_ring.py", "notebooks/09b_profiling_and_pitfalls.ipynb",
         "tests/grader/labs/test_zero.py", "tests/collectives/test_allreduce.py")


def _scope(nodeid: str) -> str:
    """The unit xdist hands a worker: a module, or the group of modules that share a costly session fixture."""
    module = nodeid.split("::", 1)[0]
    return GROUP_OF_MODULE.get(module, module)


def _start_order(item) -> int:
    scope = _scope(item.nodeid)
    return FIRST.index(scope) if scope in FIRST else len(FIRST)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by module, the modules of one shared fixture counting as one, :data:`FIRST` first."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # FIRST's order, not the number of tests in a scope

    class ByModuleAndSharedFixture(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return ByModuleAndSharedFixture(config, log)


def _check_group(item) -> None:
    """A test module that starts using a shared fixture must join its group, or two workers could each make it."""
    module = Path(item.path).resolve().relative_to(TESTS.parent).as_posix()
    for fixture, (group, modules) in SHARED.items():
        if fixture in getattr(item, "fixturenames", ()) and module not in modules:
            raise pytest.UsageError(f"{module} uses the session fixture {fixture!r}: add it to SHARED[{fixture!r}] "
                                    f"in tests/conftest.py, so that one xdist worker runs every test of {group!r}.")


@pytest.fixture(autouse=True, scope="session")
def grader_secret_in_a_temporary_folder(tmp_path_factory):
    """Grading makes the instructor's secret on first use (grader.secret): here, not in the user's config."""
    import os

    if "GRADER_SECRET_FILE" not in os.environ:
        os.environ["GRADER_SECRET_FILE"] = str(tmp_path_factory.mktemp("grader-config") / "grader-secret")
    yield


@pytest.fixture
def short_window(monkeypatch):
    """launch() calls ranks stuck after 5 s without progress (20 s in use): the verdict is the same, sooner.

    The progress rule does not depend on load (a rank still starting, or waiting for a processor, is working), so
    a shorter window only ends a hang test sooner."""
    from course.runtime import progress

    monkeypatch.setattr(progress, "WINDOW_S", 5.0)
    return 5.0


# -- a watchdog that needs no GIL ---------------------------------------------------------------------------------
# pytest-timeout's thread method needs the GIL to fire, so a hang that holds it (a C++ destructor joining a thread
# that waits for the GIL: see course.ddp.hooks) would run until CI's outer limit with nothing in the log.
# faulthandler's watchdog is a C thread: WATCHDOG_GRACE_S after a test's own timeout it writes every thread's
# Python stack to the terminal pytest started with and ends the run (exit 1), so CI fails fast and says where.
# With the ini's timeout of 300 s, a hang in a test without a timeout marker ends the run within 6 minutes.
WATCHDOG_GRACE_S = float(os.environ.get("COURSE_WATCHDOG_GRACE_S", 60))  # tests/test_watchdog.py sets it


def _terminal_fd(config) -> int:
    """A file descriptor on the terminal (or CI log) pytest started with: fd 2 is captured during a test."""
    capture = config.pluginmanager.getplugin("capturemanager")
    saved = getattr(getattr(getattr(capture, "_global_capturing", None), "err", None), "targetfd_save", None)
    return os.dup(saved if saved is not None else 2)


def pytest_configure(config):
    config._watchdog_file = os.fdopen(_terminal_fd(config), "w")


def _timeout_s(item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout_s = _timeout_s(item)
    if timeout_s > 0:
        watchdog = item.config._watchdog_file
        watchdog.write("")  # fail here, not inside the watchdog, if the file is unusable
        faulthandler.dump_traceback_later(timeout_s + WATCHDOG_GRACE_S, exit=True, file=watchdog)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
