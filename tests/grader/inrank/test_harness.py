"""grader.inrank.harness: collectives that differ between ranks after the last sampled agreement check fail the
rank, whether the script destroys its group (the world or its own) or returns with it open; a correct script runs
as before. The scripts run under ``launch`` (one run of 2 ranks for all), as the grader's harness runs them."""

import observed_ranks
import pytest

from course.runtime.launch import launch
from grader.crashes import trimmed_traceback

pytestmark = [pytest.mark.unit6, pytest.mark.slow]  # one run of 2 ranks, shared by the module

DIFFERING = [name for name, (at, _) in observed_ranks.SCRIPTS.items() if at]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """name -> each rank's (exit_code, how, error)."""
    folder = tmp_path_factory.mktemp("scripts")
    by_rank = launch(observed_ranks.scripts_run_by_the_grader, 2, str(folder), timeout_s=120)
    return {name: [ranks[name] for ranks in by_rank] for name in observed_ranks.SCRIPTS}


@pytest.mark.parametrize("name", ["correct", "correct, destroys its group"])
def test_a_correct_script_returns_on_every_rank(outcomes, name):
    assert outcomes[name] == [(0, "returned", None)] * 2


@pytest.mark.parametrize("name", DIFFERING)
def test_a_difference_after_the_last_check_fails_a_rank_naming_the_rule_and_the_call(outcomes, name):
    failed = [(code, how, error) for code, how, error in outcomes[name] if error is not None]
    assert failed, outcomes[name]  # the rank that reached the end last names it; the other may return
    code, how, error = failed[0]
    assert (code, how) == (1, "raised")
    shown = trimmed_traceback(error)  # what the grader's feedback shows under "crash on rank k"
    assert "NCCL rule 'agreement'" in shown and "collective number 5 " in shown
    assert "all_reduce float32[2, 2]" in shown and "all_reduce float32[4]" in shown
    assert "grader/inrank/" not in shown  # the grader's frames are hidden from the student
    # at the script's own line when it destroys a group; after it returned otherwise
    assert ("dist.destroy_process_group(" in shown) == ("destroys" in name)
