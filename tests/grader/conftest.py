"""One grading of the submissions in tests/submissions/ per test session, shared by the modules that read it.

Grading for real (4 ranks in the sandbox, the evaluation, the replay) is the suite's largest cost: about fifty runs.
A test module lists the submissions it reads in ``GRADED`` and their limits in ``CONFIGS``; the first test that
asks for ``graded_submissions`` grades those of every collected module in one pool, three at a time (a run waiting
on a hang leaves the cores to the others), those with their own limits (the hostile ones, which
wait longest) first, so that no long run is left alone at the end.
"""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grader.runner import GradingConfig, grade

SUBMISSIONS = Path(__file__).resolve().parents[1] / "submissions"
BASE = GradingConfig()  # a correct rank that ends last under load is waited for: it keeps making progress
WORKERS = 3


@pytest.fixture(scope="session")
def graded_submissions(request) -> dict:
    configs: dict[str, GradingConfig] = {}
    for module in {item.module for item in request.session.items if hasattr(item, "module")}:
        for name in getattr(module, "GRADED", ()):
            configs[name] = getattr(module, "CONFIGS", {}).get(name, BASE)
    order = sorted(configs, key=lambda name: configs[name] is BASE)  # own limits first

    def one(name: str):
        return name, grade(SUBMISSIONS / f"{name}.py", configs[name])

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return dict(pool.map(one, order))
