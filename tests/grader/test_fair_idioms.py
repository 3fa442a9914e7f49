"""The grader is fair to every correct idiom (issue 24): correct conversions in the styles students copy get full
marks, and the failure classes next to them get feedback that names what happened.

Each submission in tests/submissions/ listed here is graded for real (4 ranks in the sandbox), once per test session,
in one pool with the proof set's (tests/grader/conftest.py): 24 four-rank runs. Issue 35's classes are here too:
every route to a process group (init_device_mesh), a reduction made of point-to-point messages (the course's
Horovod-style allreduce, a hand-written ring), a gradient transformation applied the same way on every rank
(clipping, a constant factor) and a checkpoint that is not the final model; each with a script that must pass and
one that must fail. torch.compile is
among them: the grading environment runs it without compiling (grader.environment.COMPILE_OFF; compiling one
DigitsCNN took 128 s on one core here, measured once), so it trains uncompiled, as the reference does.
"""

from dataclasses import replace
from pathlib import Path

import pytest
from accusations import accusations

from grader import render
from grader.checks import CHECKS
from grader.checks.outputs import HELD_OUT
from grader.runner import COMPILED, GradingConfig
from grader.sandbox import Limits

pytestmark = [pytest.mark.unit6, pytest.mark.slow, pytest.mark.timeout(2400)]
SUBMISSIONS = Path(__file__).resolve().parents[1] / "submissions"
SCORED = {c.name for c in CHECKS if c.points > 0}
EFFECTS = ("device_resident_shards", "custom_sampler", "pre_sharded_tensor", "ema_checkpoint",
           "best_epoch_checkpoint")
BASE = GradingConfig()  # as the proof set: a correct rank that ends last under load is waited for
CONFIGS = {
    "spawn_under_torchrun": replace(BASE, limits=Limits(wall_s=60.0)),
    "writes_huge_file": replace(BASE, limits=Limits(wall_s=90.0, file_size_bytes=8 * 2**20)),
}
CORRECT = ("tutorial_trainer_peek", "zero1_ddp", "fsdp2_uneven_shards", "bf16_autocast", "torch_compile_ddp",
           "device_mesh_ddp", "horovod_val_counts", "ring_val_counts", "clipped_gradients",
           # issue 43: what a rank trained on is read from what its model consumed, not from a DataLoader; and an
           # honest checkpoint that is no single step's weights (an EMA, the best epoch's) is the student's model
           *EFFECTS)
WRONG = ("unsharded_val_no_reduce", "missing_library", "spawn_under_torchrun", "writes_huge_file",
         "short_last_batch_unaveraged", "one_way_messages", "scaled_gradients", "stale_checkpoint")
# wrong submission -> (its status, the checks it must fail); None: any status but "ok" (nothing but the status
# names what went wrong). short_last_batch_unaveraged trains near the target: its target_accuracy is left aside.
MISTAKES = {"unsharded_val_no_reduce": ("ok", {"metrics_averaged"}), "missing_library": ("missing library", None),
            "spawn_under_torchrun": (None, None), "writes_huge_file": ("file too large", None),
            "short_last_batch_unaveraged": ("ok", {"equal_parameters"}),
            "one_way_messages": ("ok", {"metrics_averaged"}), "scaled_gradients": ("ok", {"matches_single_process"}),
            "stale_checkpoint": ("ok", {"target_accuracy"})}
NEAR_TARGET = {"short_last_batch_unaveraged"}
# proof-set submissions on the other side of a class here (tests/grader/test_submissions.py proves them too)
PAIRED = ("reference", "data_parallel_one_process")


GRADED = CORRECT + WRONG + PAIRED  # graded once per session with the proof set's (tests/grader/conftest.py)


@pytest.fixture(scope="module")
def graded(graded_submissions):
    return graded_submissions


def messages(results) -> dict[str, str]:
    return {c.name: c.message for c in results.checks}


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_idiom_gets_full_marks_and_no_accusation(graded, name):
    results = graded[name]
    assert (results.status, results.score, results.max_score) == ("ok", 100, 100), "\n".join(
        f"{c.name}: {c.message}" for c in results.checks if not c.passed)
    assert all(c.assessed for c in results.checks)


def test_mistakes_are_declared_once():
    assert set(MISTAKES) == set(WRONG) and NEAR_TARGET <= set(MISTAKES)


@pytest.mark.parametrize("name", [name for name, (status, _) in MISTAKES.items() if status == "ok"])
def test_each_mistake_fails_exactly_its_check(graded, name):
    status, checks = MISTAKES[name]
    results = graded[name]
    failed = {c.name for c in results.checks if not c.passed and c.assessed} - (
        {"target_accuracy"} if name in NEAR_TARGET else set())
    assert (results.status, failed) == (status, checks), "\n".join(
        f"{c.name}: {c.message}" for c in results.checks if not c.passed)


def test_no_feedback_line_accuses_a_correct_script(graded):
    assert {name: accusations(graded[name]) for name in CORRECT} == {name: [] for name in CORRECT}
    # the words do catch what the grader says of each wrong script (or that its checks were not run)
    assert [name for name in WRONG if not accusations(graded[name])] == []


def test_torch_compile_runs_without_compiling_and_the_feedback_says_so_once(graded):
    results = graded["torch_compile_ddp"]
    assert results.detail == f"all ranks finished. {COMPILED}"
    assert render.feedback(results).count(COMPILED) == 1
    assert all(COMPILED not in graded[name].detail for name in CORRECT if name != "torch_compile_ddp")


def test_the_self_check_and_class_grade_accuracies_differ_and_the_feedback_says_why(graded):
    """The held-out copy the grader scores is jittered with a seed drawn from the instructor's secret, so
    `grader check` and the class grade print different accuracies for one script: the target check says so, pass
    or fail (tests/grader/test_checks.py proves the failing side), and the self-check shows that check."""
    for name in CORRECT:
        message = messages(graded[name])["target_accuracy"]
        assert message.endswith(HELD_OUT) and "`grader check` on your machine and the class grade" in message
    assert next(c for c in CHECKS if c.name == "target_accuracy").visibility == "visible"


def test_a_peeked_batch_is_not_counted_as_trained(graded):
    shards = messages(graded["tutorial_trainer_peek"])["disjoint_shards"]
    assert "(300, 300, 300, 300 samples)" in shards  # 332 each when the peeked batch was counted
    assert "global batch of 128" in messages(graded["tutorial_trainer_peek"])["lr_scaled"]  # not 256


def test_zero_is_recorded_by_what_it_trains(graded):
    got = messages(graded["zero1_ddp"])
    assert "(Adam)" in got["lr_scaled"]  # the update rule, not the wrapper's name
    assert got["rank0_checkpoint_and_logs"] == "only rank 0 wrote the checkpoint and printed."  # in-memory saves


def test_bf16_autocast_is_replayed_at_its_precision(graded):
    replayed = messages(graded["bf16_autocast"])["matches_single_process"]
    assert "within bfloat16 rounding" in replayed


def test_metrics_need_a_reduction_the_grader_saw(graded):
    results = graded["unsharded_val_no_reduce"]
    failed = {c.name for c in results.checks if not c.passed}
    assert (results.status, failed) == ("ok", {"metrics_averaged"})
    assert "without combining anything across ranks" in messages(results)["metrics_averaged"]


def test_a_missing_library_is_named_in_one_line_and_no_check_runs(graded):
    results = graded["missing_library"]
    assert results.status == "missing library" and results.score == 0
    assert results.detail.startswith("this library is not available in the grading environment: accelerate")
    assert "the assignment needs only torch and the course" in results.detail
    assert not any(c.ran for c in results.checks)


def test_processes_spawned_under_torchrun_are_named(graded):
    results = graded["spawn_under_torchrun"]
    assert results.status != "ok" and results.score == 0
    assert "torch.multiprocessing.spawn (rank 0: 2" in results.detail, results.detail


def test_the_graders_file_limit_is_named_as_the_graders(graded):
    results = graded["writes_huge_file"]
    assert results.status == "file too large"
    assert results.detail.startswith("the grader's limit stopped rank 1: a process wrote a file larger than the "
                                     "grader allows (8 MiB per file)."), results.detail
    assert render.feedback(results).splitlines()[1] == f"  {results.detail}"  # at the top, in one line
    assert {c.name for c in results.checks if not c.passed} == SCORED


def test_the_short_last_batch_left_unaveraged_is_named(graded):
    results = graded["short_last_batch_unaveraged"]
    failed = {c.name for c in results.checks if not c.passed and c.assessed} - {"target_accuracy"}  # near target
    assert (results.status, failed) == ("ok", {"equal_parameters"})
    assert "step 10 was the short last batch of an epoch: 12 samples on rank 0 instead of 32" in \
        messages(results)["equal_parameters"]
    assert {c.name for c in results.checks if not c.assessed} == {"metrics_averaged"}  # different models by then


def test_every_route_to_a_process_group_is_recognised(graded):
    """init_device_mesh makes the default group itself: the grader sees the group, not the call that made it.
    Processes that never make one (nn.DataParallel in one process) are still told so."""
    assert "all 4 ranks joined one gloo process group" in messages(graded["device_mesh_ddp"])["ran_to_the_end"]
    alone = messages(graded["data_parallel_one_process"])["ran_to_the_end"]
    assert "ranks 0–3 never joined a process group" in alone


def test_a_reduction_made_of_messages_counts_as_one(graded):
    """The course's Horovod-style allreduce and a hand-written ring send point-to-point messages that bring every
    rank's counts to rank 0: a reduction. Messages that only leave rank 0 combine nothing into what it reports."""
    for name in ("horovod_val_counts", "ring_val_counts"):
        assert messages(graded[name])["metrics_averaged"].startswith("all 6 reported validation accuracies match")
    results = graded["one_way_messages"]
    failed = {c.name for c in results.checks if not c.passed}
    message = messages(results)["metrics_averaged"]
    assert (results.status, failed) == ("ok", {"metrics_averaged"})
    assert "no messages that brought every rank's numbers to rank 0" in message
    # the advice shards without the repeats DistributedSampler pads with, and sums counts
    assert "dataset[rank::world_size]" in message and "shuffle=False" not in message and "Sum both counts" in message


def test_a_gradient_transformation_on_every_rank_is_named(graded):
    """clip_grad_norm_ after DDP's averaging shortens the gradient the same way on every rank: named, and passed.
    A constant factor on the loss is named as one, and fails: the gradients were averaged, then scaled."""
    clipped = messages(graded["clipped_gradients"])["matches_single_process"]
    assert "clipped to norm 0.1" in clipped and "(clip_grad_norm_)" in clipped
    results = graded["scaled_gradients"]
    failed = {c.name for c in results.checks if not c.passed}
    scaled = messages(results)["matches_single_process"]
    assert (results.status, failed) == ("ok", {"matches_single_process"})
    assert "multiplied by 0.50 on every rank" in scaled and "not averaged" not in scaled


def test_a_checkpoint_that_is_not_the_final_model_is_a_mistake_not_tampering(graded):
    results = graded["stale_checkpoint"]
    failed = {c.name for c in results.checks if not c.passed}
    assert (results.status, failed, results.grade_status) == ("ok", {"target_accuracy"}, "ok")
    assert results.score == 90  # not withheld
    message = messages(results)["target_accuracy"]
    assert "holds the parameters rank 0 had after step 57, not after its last step 60" in message
    assert "not the final model" in message
    assert messages(graded["reference"])["target_accuracy"].startswith("your checkpoint scored")


def test_an_ema_checkpoint_is_said_to_be_one_and_graded_as_the_students_model(graded):
    message = messages(graded["ema_checkpoint"])["target_accuracy"]
    assert message.startswith("your checkpoint is an exponential moving average (EMA, decay 0.9) of rank 0's "
                              "weights after each optimizer step"), message
    assert "graded as your model" in message


def test_the_data_checks_read_what_the_model_consumed(graded):
    for name in ("device_resident_shards", "pre_sharded_tensor"):
        assert "saw disjoint shards" in messages(graded[name])["disjoint_shards"], name
