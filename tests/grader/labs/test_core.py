"""The lab driver (grader.labs.core) on a toy lab: verdicts merged over ranks and runs, errors in plain words."""

import pytest
import toy_lab

from grader import render
from grader.labs.core import run_lab
from grader.results import Check, CheckResult, LabResult

pytestmark = pytest.mark.timeout(240)

RIGHT = "def double(tensor):\n    return tensor * 2\n"


def write(tmp_path, text):
    path = tmp_path / "toy.py"
    path.write_text(text)
    return str(path)


def test_a_right_answer_passes_every_visible_check_and_hidden_ones_only_when_asked(tmp_path):
    path = write(tmp_path, RIGHT)
    visible = run_lab(toy_lab.LAB, path)
    assert visible.passed and [r.name for r in visible.checks] == ["doubles", "cross"]
    assert visible.score == visible.max_score == 3
    hidden = run_lab(toy_lab.LAB, path, hidden=True)
    assert hidden.passed and hidden.max_score == 4 and "hidden_one" in [r.name for r in hidden.checks]


def test_the_first_failure_is_reported_with_its_run_and_the_cross_check_sees_it_too(tmp_path):
    path = write(tmp_path, "import torch.distributed as dist\n\ndef double(tensor):\n"
                           "    return tensor * (3 if dist.get_rank() == 1 else 2)\n")
    result = run_lab(toy_lab.LAB, path)
    assert result.failed() == ["doubles", "cross"] and result.score == 0
    messages = {r.name: r.message for r in result.checks}
    assert messages["doubles"] == "world_size=2, offset 0: rank 1 got [3.0, 3.0, 3.0], expected [2.0, 2.0, 2.0]"
    assert messages["cross"] == "world_size=2, offset 0: outside the ranks, ranks [1] are wrong"
    assert "[FAIL] doubles on every rank (0/2)" in render.lab_feedback(result)


def test_a_student_exception_names_the_rank_the_error_and_the_line_of_the_student_file(tmp_path):
    path = write(tmp_path, "import torch.distributed as dist\n\ndef double(tensor):\n"
                           "    if dist.get_rank() == 1:\n        raise ValueError('bad shape')\n"
                           "    return tensor * 2\n")
    result = run_lab(toy_lab.LAB, path)
    assert result.failed() == ["doubles", "cross"]
    assert result.checks[0].message == (f"world_size=2, offset 0: your double raised ValueError: bad shape on rank 1 "
                                         f"(line 5 of {path})")
    assert "Traceback" not in render.lab_feedback(result)


def test_the_stub_fails_every_check_as_not_attempted_and_stops_after_the_first_run(tmp_path):
    path = write(tmp_path, "def double(tensor):\n    raise NotImplementedError('write double')\n")
    result = run_lab(toy_lab.LAB, path, hidden=True)
    assert result.failed() == ["doubles", "cross", "hidden_one"]
    assert all(r.message.startswith("Not attempted yet: your double still raises NotImplementedError")
               for r in result.checks)
    assert result.runs == 1  # one launch, not one per run


def test_a_missing_file_and_a_missing_entry_are_explained(tmp_path):
    missing = run_lab(toy_lab.LAB, str(tmp_path / "nope.py"))
    assert "does not exist: run the lab's start cell first" in missing.checks[0].message
    wrong_name = run_lab(toy_lab.LAB, write(tmp_path, "def triple(tensor):\n    return tensor * 3\n"))
    assert "defines no double: the lab calls double, keep that name" in wrong_name.checks[0].message


def test_a_hang_is_a_timeout_naming_the_waiting_ranks(tmp_path, short_window):
    path = write(tmp_path, "import time\nimport torch.distributed as dist\n\ndef double(tensor):\n"
                           "    if dist.get_rank() == 0:\n        time.sleep(120)\n    dist.barrier()\n"
                           "    return tensor * 2\n")
    # stopped once neither rank has made progress for the window (5 s here, 20 s in use), long before the limit: a
    # rank still starting on a loaded machine uses processor time, so the verdict does not depend on load
    lab = toy_lab.LAB.__class__(**{**toy_lab.LAB.__dict__, "runs": ({"world_size": 2, "timeout_s": 600},)})
    message = run_lab(lab, path).checks[0].message
    assert "your double did not finish" in message and "rank(s) 0 made no progress for 5 s" in message
    assert "rank 1 was waiting for it in barrier" in message and message.endswith("(toy hint)")


def test_a_check_that_shows_a_measure_prints_it_and_a_zero_point_one_reads_info():
    speed = Check("speed", "modelled speed (informational)", 0, shows_measure=True)
    result = LabResult("toy", "toy", "toy.py", (CheckResult.of(speed, True, "MODELLED: 1.03x DDP's"),), 0.1)
    lines = render.lab_feedback(result).splitlines()
    assert "  [INFO] modelled speed (informational) (0/0): MODELLED: 1.03x DDP's" in lines
    scored = CheckResult.of(Check("speed", "modelled speed", 2, shows_measure=True), True, "1.03x")
    assert "  [PASS] modelled speed (2/2): 1.03x" in render.lab_feedback(LabResult("toy", "toy", "toy.py", (scored,)))
