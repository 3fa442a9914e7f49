"""Fixtures shared by the test modules."""

import pytest
import torch


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
