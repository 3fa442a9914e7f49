"""grader.labs.pipeline_runner: the stub fails every check, the solution passes every one, and each wrong runner
fails exactly the checks its mistake breaks, with a message that names the mistake (a hang: who waits for whom)."""

import os

import pytest

from grader import render
from grader.labs.core import run_lab
from grader.labs.pipeline_runner import check as pipeline_runner
from grader.labs.pipeline_runner import precheck

pytestmark = [pytest.mark.unit8, pytest.mark.timeout(600)]
HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EVERY = {check.name for check in pipeline_runner.CHECKS}


@pytest.mark.slow
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(pipeline_runner.LAB, os.path.join(ROOT, "grader", "labs", "pipeline_runner", "stub.py"))
    assert set(result.failed()) == EVERY
    assert result.checks[0].message.startswith("Not attempted yet: your run_stage still raises")


@pytest.mark.slow
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(pipeline_runner.LAB, os.path.join(ROOT, "grader", "labs", "pipeline_runner", "reference.py"),
                     hidden=True)
    assert result.passed, render.lab_feedback(result)


@pytest.mark.slow
@pytest.mark.parametrize(("attempt", "fails", "fragment"), [
    # the gradients: the first beyond the derived bound (grader.labs.pipeline_runner.bounds), named
    ("no_wait", {"gradients", "waits"}, ("never waited its irecv number 1 (from rank",
                                         "'s gradient (backward, step 0, rank ", "beyond rounding: a bug (bound ")),
    # found by the precheck, before any rank starts: who waits for whom, the wrong send
    ("wrong_peer", EVERY, ("your run_stage would deadlock: simulated before starting any rank, ",
                           "rank 2 waits to receive from rank 3 (during B0, its receive number 1 from rank 3)",
                           "rank 3 sends 2 message(s) to rank 0, which never receives from rank 3")),
    ("keeps_last_only", EVERY, "keep them per micro-batch"),
    ("imports_course", EVERY, "your file uses course.model_parallel.pipeline.run"),
])
def test_each_wrong_runner_fails_the_checks_its_mistake_breaks(attempt, fails, fragment, short_window, planted):
    result = run_lab(pipeline_runner.LAB, planted("pipeline_runner", attempt))
    assert set(result.failed()) == fails, render.lab_feedback(result)
    if attempt == "wrong_peer":  # no rank of the run started: reported without waiting for any time limit
        assert result.runs == 1 and all("simulated before starting any rank" in r.message for r in result.checks)
    for part in (fragment,) if isinstance(fragment, str) else fragment:  # a hang: who waits for whom, the wrong send
        assert any(part in r.message for r in result.checks if not r.passed), render.lab_feedback(result)


def test_nccl_rules_catch_the_old_late_sends_design():
    """The checker used to issue every isend 50 ms late from a second thread: on NCCL, one communicator used from two
    threads (and sends reordered). The ranks keep NCCL's rules, so the reference solution fails under that design."""
    import late_sends

    from course.runtime.launch import RankFailed, launch

    reference = os.path.join(ROOT, "grader", "labs", "pipeline_runner", "reference.py")
    with pytest.raises(RankFailed, match="NCCL rule 'threads'.*issue every call of a group from one thread"):
        launch(late_sends.late_sends_run, 3, reference, 3, timeout_s=60)


def _imports_isend_by_name(tmp_path) -> str:
    reference = os.path.join(ROOT, "grader", "labs", "pipeline_runner", "reference.py")
    text = open(reference).read().replace("import torch.distributed as dist\n", (
        "import torch.distributed as dist\nfrom torch.distributed import irecv as receive, isend\n"))
    text = text.replace("dist.isend(", "isend(").replace("dist.irecv(", "receive(")
    (tmp_path / "pipeline_runner.py").write_text(text)
    return str(tmp_path / "pipeline_runner.py")


def test_a_runner_that_imports_isend_by_name_is_heard(tmp_path):
    """The group itself records the messages: `from torch.distributed import isend, irecv` is counted too."""
    result = run_lab(pipeline_runner.LAB, _imports_isend_by_name(tmp_path))
    assert result.passed, render.lab_feedback(result)


def test_the_precheck_plays_names_imported_before_it(tmp_path):
    """Played before any rank starts, an irecv imported under another name must not reach torch (its wait would
    last until the run's limit): every stage's messages are heard, and the same as the reference's."""
    config = {"world_size": 4, "micro_batches": 5, "seed": 0}
    reference = os.path.join(ROOT, "grader", "labs", "pipeline_runner", "reference.py")
    heard = precheck.messages(_imports_isend_by_name(tmp_path), config, pipeline_runner._model_config)
    assert heard == precheck.messages(reference, config, pipeline_runner._model_config)
    assert all(any(call.kind == "recv" for call in stage) for stage in heard[1:])
