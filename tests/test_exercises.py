"""Every exercise of the notebooks: its checker fails the untouched stub and passes the solution.

The stub is read from the notebook itself (the code cell that defines the function), the solution from
``notebooks/solutions/<notebook>_<function>.py``; nbval runs each notebook with the stub untouched, so a student
who skips an exercise is not blocked.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from course.collectives import simulation as allreduce_sim
from course.ddp import buckets
from course.ddp import internals as ddp
from course.model_parallel import bubble as pipeline_bubble
from course.optimization import convergence, lr_scaling, noise_scale

pytestmark = pytest.mark.unit0
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# (notebook, function the student writes, its checker)
EXERCISES: list[tuple[str, str, Callable]] = [
    ("01_gd_vs_sgd", "updates_to_converge", convergence.check_updates_to_converge),
    ("02_large_batch", "two_batch", noise_scale.check_two_batch_exercise),
    ("02_large_batch", "linear_with_warmup", lr_scaling.check_warmup_exercise),
    ("03_naive_multi_gpu", "bubble", pipeline_bubble.check_bubble_exercise),
    ("04_allreduce", "send_chunk", allreduce_sim.check_ring_send_chunk),
    ("04b_distributed_optimizer", "my_assign_buckets", buckets.check_assign_buckets),
    ("05_ddp", "my_shard", ddp.check_shard),
]
IDS = [f"{notebook}:{function}" for notebook, function, _ in EXERCISES]


def stub_source(notebook: str, function: str) -> str:
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    defining = [s for s in sources if s.lstrip().startswith(f"def {function}(")]
    assert len(defining) == 1, f"{notebook} should have one cell defining {function}, has {len(defining)}"
    return defining[0]


def verdict(check: Callable, source: str, function: str) -> tuple[bool, str]:
    namespace: dict = {}
    exec(compile(source, function, "exec"), namespace)  # noqa: S102 - the notebook's own cell, as Jupyter runs it
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = check(namespace[function])
    assert isinstance(result, bool), f"{check.__name__} returned {result!r}: a checker's verdict is a bool"
    return result, printed.getvalue()


@pytest.mark.parametrize(("notebook", "function", "check"), EXERCISES, ids=IDS)
def test_the_checker_fails_the_untouched_stub_and_says_so(notebook, function, check):
    source = stub_source(notebook, function)
    assert "raise NotImplementedError" in source, f"{notebook}'s {function} cell is not a stub: it gives the answer"
    passed, printed = verdict(check, source, function)
    assert not passed and "Not attempted yet" in printed, printed


@pytest.mark.parametrize(("notebook", "function", "check"), EXERCISES, ids=IDS)
def test_the_checker_passes_the_solution(notebook, function, check):
    solution = NOTEBOOKS / "solutions" / f"{notebook.split('_')[0]}_{function}.py"
    passed, printed = verdict(check, solution.read_text(), function)
    assert passed, printed


def test_every_solution_belongs_to_an_exercise():
    expected = {f"{notebook.split('_')[0]}_{function}.py" for notebook, function, _ in EXERCISES}
    assert {p.name for p in (NOTEBOOKS / "solutions").glob("*.py")} == expected


@pytest.mark.parametrize(("notebook", "function", "check"), EXERCISES, ids=IDS)
def test_every_checker_turns_an_error_or_a_non_function_into_feedback(notebook, function, check, capsys):
    assert check(lambda *args: 1 / 0) is False
    assert "raised ZeroDivisionError" in capsys.readouterr().out
    assert check(3) is False
    assert "Not yet: expected the function you wrote, got int 3" in capsys.readouterr().out


def test_a_wrong_attempt_gets_feedback_not_a_traceback(capsys):
    assert ddp.check_shard(lambda n, rank, world_size: list(range(rank, n, world_size))) is False  # no padding
    assert "Not yet: n=10, rank=2, world_size=4" in capsys.readouterr().out
    assert buckets.check_assign_buckets(lambda sizes, cap: 1 / 0) is False
    assert "your function raised ZeroDivisionError" in capsys.readouterr().out
