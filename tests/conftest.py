"""Fixtures shared by the test modules, and each test's course unit taken from its folder."""

from pathlib import Path

import pytest
import torch

# tests/<folder>/ mirrors course/<folder>/; a module of another unit says so with its own `pytestmark`
UNIT_OF_FOLDER = {"runtime": "unit0", "optimization": "unit2", "naive": "unit3", "model_parallel": "unit3",
                  "collectives": "unit4", "ddp": "unit5", "multinode": "unit5", "perf": "unit5", "monitor": "unit6",
                  "memory": "unit7"}
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m unitN` selects
def pytest_collection_modifyitems(items):
    """Mark every test under tests/<folder>/ with its folder's unit, unless the module names another unit."""
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:  # the notebooks (nbval)
            continue
        unit = UNIT_OF_FOLDER.get(folder)
        if unit and not any(mark.name.startswith("unit") for mark in item.iter_markers()):
            item.add_marker(unit)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and lose a lot on a shared, oversubscribed CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def grader_secret_in_a_temporary_folder(tmp_path_factory):
    """Grading makes the instructor's secret on first use (grader.secret): here, not in the user's config."""
    import os

    if "GRADER_SECRET_FILE" not in os.environ:
        os.environ["GRADER_SECRET_FILE"] = str(tmp_path_factory.mktemp("grader-config") / "grader-secret")
    yield
