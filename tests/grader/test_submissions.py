"""The proof: the reference gets full marks; each broken or hostile submission fails exactly its check(s).

Every submission in tests/submissions/ is graded for real (4 ranks in the sandbox), once per test session, in one
pool with the fair-idiom set's (tests/grader/conftest.py); each test then reads its results. Expensive: 36 four-rank
runs, and 4 more grading a small class twice. Hostile runs get tight limits so they end quickly.
"""

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from accusations import accusations

from course.runtime.pace import Pace
from grader import cli
from grader.checks import CHECKS
from grader.runner import GradingConfig
from grader.sandbox import Limits

pytestmark = [pytest.mark.unit6, pytest.mark.slow, pytest.mark.timeout(2400)]
SUBMISSIONS = Path(__file__).resolve().parents[1] / "submissions"
ALL = {c.name for c in CHECKS}
SCORED = {c.name for c in CHECKS if c.points > 0}
BASE = GradingConfig()  # a correct rank that ends last under load is waited for: it keeps making progress
CONFIGS = {
    # busy to the end, 4 ranks on 2 cores: 4 s anywhere (a limit reached before the ranks start is a timeout too),
    # so that its spinning ranks take little from the gradings beside it
    "infinite_loop": replace(BASE, limits=Limits(wall_s=4.0), pace=Pace(1.0)),
    "hang_in_collective": replace(BASE, limits=Limits(wall_s=90.0)),  # stopped once no rank progresses for 20 s
    "memory_bomb": replace(BASE, limits=Limits(memory_bytes=2**30)),
}
# submission -> (status, the exact set of checks it must fail)
EXPECTED = {
    "reference": ("ok", set()),
    # every rank draws the same batches, so DDP's averaging cannot be seen: no credit for what it would show
    "no_sampler": ("ok", {"disjoint_shards", "reshuffled"}),
    "per_rank_shuffles": ("ok", {"disjoint_shards"}),
    # ... and its metrics, right only because every rank holds the same model, were never reduced across ranks
    "identical_ranks": ("ok", {"disjoint_shards", "reshuffled", "lr_scaled", "rank0_checkpoint_and_logs",
                               "metrics_averaged"}),
    "rank0_trains_alone": ("ok", {"ran_to_the_end", "disjoint_shards", "reshuffled", "equal_parameters",
                                  "matches_single_process", "lr_scaled"}),
    "data_parallel_one_process": ("ok", {"ran_to_the_end", "disjoint_shards", "reshuffled", "equal_parameters",
                                         "matches_single_process", "lr_scaled", "rank0_checkpoint_and_logs"}),
    "no_set_epoch": ("ok", {"reshuffled"}),
    "summed_gradients": ("ok", {"matches_single_process"}),
    # the averaged metrics of ranks holding different models are not assessed, so not blamed
    "per_rank_seeds": ("ok", {"equal_parameters", "matches_single_process"}),
    "every_rank_checkpoints": ("ok", {"rank0_checkpoint_and_logs"}),
    "unscaled_lr": ("ok", {"lr_scaled"}),
    "sqrt_lr_adam": ("ok", set()),
    "no_checkpoint": ("ok", {"target_accuracy"}),
    "fake_score": ("ok", {"metrics_averaged", "target_accuracy", "integrity"}),
    "forged_records": ("ok", {"metrics_averaged", "target_accuracy", "integrity"}),
    # signed by the rank itself but not in the record format: refused, and nothing but integrity moves
    "malformed_records": ("ok", {"integrity"}),
    # rank 0 trains alone on its quarter of the data (about 0.91 on the grader's held-out copy: see NEAR_TARGET)
    "noop_allreduce": ("ok", {"equal_parameters", "matches_single_process", "integrity"}),
    "output_flood": ("ok", {"rank0_checkpoint_and_logs"}),
    "no_shutdown": ("ok", {"ran_to_the_end"}),
    "diverging_ranks": ("ok", {"equal_parameters"}),
    "local_metrics": ("ok", {"metrics_averaged"}),
    "too_many_epochs": ("ok", {"target_accuracy"}),
    "wraps_save": ("ok", {"integrity"}),
    # what forked children do (a grandchild writing /dev/null from /, DataLoader workers writing logs) is not the rank's
    "forked_grandchild": ("ok", set()),
    "dataloader_worker_log": ("ok", set()),
    # its checkpoint is a second model, trained by hand on the test digits: not what rank 0's optimizer produced
    # (a checkpoint the recorded training did not produce is flagged for review, as a replaced all_reduce is)
    "second_model": ("ok", {"target_accuracy", "integrity"}),
    # ... or copied into the trained model before one last optimizer step (at learning rate 0)
    "copied_in_model": ("ok", {"target_accuracy", "integrity"}),
    "exit_before_training": ("ok", SCORED),
    "hang_in_collective": ("hang on rank 3", SCORED),
    "crash_on_rank_2": ("crash on rank 2", SCORED),
    "only_rank0_trains": ("early exit on rank 1, 2, 3", SCORED),
    "infinite_loop": ("timeout", SCORED),
    "memory_bomb": ("out of memory", SCORED),
    "fork_bomb": ("too many processes", SCORED),
}
# submission -> the checks its finished run cannot show (neither points nor a penalty: left out of the total)
NOT_ASSESSED = {
    # every rank draws the same batches, so DDP's averaging cannot be seen
    "no_sampler": {"equal_parameters", "matches_single_process"},
    "identical_ranks": {"equal_parameters", "matches_single_process"},
    # the ranks' models differ by the first report, so no one model's accuracy is the mean
    "per_rank_seeds": {"metrics_averaged"},
    "noop_allreduce": {"metrics_averaged"},
}
# correct idioms and the feedback classes of issue 24, proven in tests/grader/test_fair_idioms.py
PROVEN_ELSEWHERE = {"tutorial_trainer_peek", "zero1_ddp", "fsdp2_uneven_shards", "bf16_autocast", "torch_compile_ddp",
                    "unsharded_val_no_reduce", "missing_library", "spawn_under_torchrun", "writes_huge_file",
                    "short_last_batch_unaveraged", "device_mesh_ddp", "horovod_val_counts", "ring_val_counts",
                    "clipped_gradients", "one_way_messages", "scaled_gradients", "stale_checkpoint",
                    "device_resident_shards", "custom_sampler", "pre_sharded_tensor", "ema_checkpoint",
                    "best_epoch_checkpoint"}
# Broken submissions that still train: their held-out accuracy lands within a few points of the target, above it
# on one CPU and below on another (per_rank_seeds: 0.94 here, 0.91 elsewhere), so their target_accuracy verdict is
# not part of the proof. target_accuracy is proven by submissions that fail it by construction (no checkpoint, over
# the epoch budget, 2 epochs of 6) and by the reference, which passes it.
NEAR_TARGET = {"no_sampler", "no_set_epoch", "summed_gradients", "per_rank_seeds", "every_rank_checkpoints",
               "unscaled_lr", "noop_allreduce", "output_flood", "no_shutdown", "diverging_ranks", "local_metrics",
               "wraps_save", "per_rank_shuffles", "identical_ranks", "rank0_trains_alone", "data_parallel_one_process"}


GRADED = list(EXPECTED)  # graded once per session with the fair-idiom set's (tests/grader/conftest.py)


@pytest.fixture(scope="module")
def graded(graded_submissions):
    return graded_submissions


def test_every_submission_is_in_the_proof_set():
    assert {p.stem for p in SUBMISSIONS.glob("*.py")} == set(EXPECTED) | PROVEN_ELSEWHERE
    assert set(EXPECTED) >= NEAR_TARGET | set(NOT_ASSESSED) and not set(EXPECTED) & PROVEN_ELSEWHERE


def test_every_check_is_failed_by_some_submission_that_ran_normally():
    assert set().union(*(failed for status, failed in EXPECTED.values() if status == "ok")) == ALL


def test_every_check_is_failed_alone_by_some_submission():
    alone = {next(iter(failed)) for status, failed in EXPECTED.values() if status == "ok" and len(failed) == 1}
    assert alone == ALL


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_submission_gets_its_status_and_fails_exactly_its_checks(graded, name):
    status, failed = EXPECTED[name]
    results = graded[name]
    got = {c.name for c in results.checks if not c.passed and c.assessed} - (
        {"target_accuracy"} if name in NEAR_TARGET else set())
    unseen = {c.name for c in results.checks if not c.assessed}
    assert (results.status, got, unseen) == (status, failed, NOT_ASSESSED.get(name, set())), results.detail + "\n" + \
        "\n".join(f"{c.name}: {c.message}" for c in results.checks if not c.passed)


def test_a_check_that_cannot_be_assessed_neither_awards_nor_takes_points(graded):
    results = graded["no_sampler"]
    unseen = [c for c in results.checks if not c.assessed]
    assert all(c.score == 0 and c.message.startswith("cannot be assessed: needs each rank to see its own shard")
               for c in unseen)
    assessed = sum(c.max_score for c in results.checks if c.assessed)
    assert assessed == 70 and results.score == pytest.approx(results.raw_score * 100 / 70, abs=0.01)
    assert not any(c.passed and "not assessed" in c.message for r in graded.values() for c in r.checks)


def test_the_reference_gets_full_marks(graded):
    assert graded["reference"].score == graded["reference"].max_score == 100


def test_feedback_speaks_the_course_language(graded):
    message = {c.name: c.message for c in graded["no_sampler"].checks}["disjoint_shards"]
    assert "ranks 1–3 saw the same samples as rank 0" in message and "DistributedSampler" in message
    summed = {c.name: c.message for c in graded["summed_gradients"].checks}["matches_single_process"]
    assert "4.00x" in summed and "divide by world_size" in summed
    assert "barrier()" in graded["hang_in_collective"].detail
    crash = graded["crash_on_rank_2"]  # rank 2's own traceback, not rank 0's lost connection
    assert 'raise RuntimeError("deliberate failure on rank 2")' in crash.detail and "Connection" not in crash.detail
    assert "took no optimizer step and exited early" in graded["only_rank0_trains"].detail


def test_credit_only_for_data_parallelism_that_happened(graded):
    messages = {c.name: c.message for c in graded["identical_ranks"].checks}
    assert graded["identical_ranks"].raw_score <= 25  # 65 when identical ranks were credited for staying identical
    assert "needs each rank to see its own shard" in messages["equal_parameters"]
    assert "needs each rank to see its own shard" in messages["matches_single_process"]
    alone = {c.name: c.message for c in graded["rank0_trains_alone"].checks}
    assert "ranks 1–3 took no optimizer step" in alone["ran_to_the_end"]
    assert "ranks 1–3 took no optimizer step" in alone["matches_single_process"]
    one_process = {c.name: c.message for c in graded["data_parallel_one_process"].checks}["lr_scaled"]
    assert "never joined a process group" in one_process and "512" not in one_process


def test_the_square_root_rule_is_accepted_for_adam_and_named(graded):
    message = {c.name: c.message for c in graded["sqrt_lr_adam"].checks}["lr_scaled"]
    assert "sqrt rule (Adam)" in message


def test_checks_a_crash_left_without_evidence_give_no_advice(graded):
    for name in ("crash_on_rank_2", "hang_in_collective"):
        for check in graded[name].checks[1:]:
            if check.name != "integrity":
                assert check.message.startswith("not assessed: the run did not finish"), (name, check.message)


def test_a_detected_tamper_withholds_the_score(graded):
    for name in ("fake_score", "forged_records", "malformed_records", "noop_allreduce", "wraps_save"):
        results = graded[name]
        assert results.score == 0 and results.raw_score > 0 and results.grade_status == "integrity violation"


def test_malformed_records_are_refused_saying_what_was_wrong(graded):
    message = {c.name: c.message for c in graded["malformed_records"].checks}["integrity"]
    assert "2 record(s) on the grader's record channel did not fit the record format" in message
    assert "'step' record of rank 1: field 'indices' should be a list of int, got str" in message


def test_printed_numbers_are_not_believed(graded):
    results = graded["fake_score"]
    assert "0.99" in results.output  # it printed a fake score ...
    assert results.test_accuracy < 0.92  # ... the grader measured its own
    assert "forged lines" in {c.name: c.message for c in results.checks}["integrity"]


def test_records_forged_through_the_probes_gain_nothing(graded):
    results = graded["forged_records"]
    messages = {c.name: c.message for c in results.checks}
    assert "called the grader's probes itself" in messages["integrity"]
    assert "reported val_accuracy 0.9900" in messages["metrics_averaged"]  # against the grader's own evaluation
    assert results.test_accuracy < 0.92 and results.score <= graded["too_many_epochs"].score


def test_only_the_model_rank_0s_optimizer_produced_is_evaluated(graded):
    results = graded["second_model"]
    messages = {c.name: c.message for c in results.checks}
    assert results.test_accuracy is None and results.raw_score == 90 and results.score == 0
    assert "does not hold the parameters rank 0's optimizer produced" in messages["target_accuracy"]
    assert "did not produce" in messages["integrity"] and results.grade_status == "integrity violation"
    copied = {c.name: c.message for c in graded["copied_in_model"].checks}["target_accuracy"]
    assert graded["copied_in_model"].test_accuracy is None and "outside optimizer.step()" in copied
    assert graded["reference"].test_accuracy is not None  # the reference's checkpoint is bound to its last step


def test_flooded_output_is_truncated(graded):
    results = graded["output_flood"]
    assert "bytes in all" in results.output and len(results.output) < 20_000


def test_a_class_is_graded_in_parallel_and_nothing_is_lost(tmp_path, graded):
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "alice.py").write_text((SUBMISSIONS / "reference.py").read_text())
    (folder / "bob.py").write_text("import torch\ndef main(:\n")
    (folder / "carol").mkdir()  # a folder holding a notebook instead of a script
    (folder / "carol" / "train_4gpu.ipynb").write_text("{}")
    (folder / "dave.py").write_text("")
    (folder / "erin.py").write_text((SUBMISSIONS / "rank0_trains_alone.py").read_text())
    out = tmp_path / "out"
    assert cli.main(["grade", str(folder), "-o", str(out), "-j", "2"]) == 0
    rows = list(csv.reader(open(out / "gradebook.csv")))
    assert rows[1][0] == "points possible" and len(rows) == 7
    statuses = {r[0]: r[1] for r in rows[2:]}
    assert statuses == {"alice.py": "ok", "bob.py": "bad submission", "carol": "bad submission",
                        "dave.py": "bad submission", "erin.py": "ok"}
    alice = json.loads((out / "gradescope" / "alice" / "results.json").read_text())
    assert alice["score"] == 100 and (out / "feedback" / "bob.txt").read_text().count("not valid Python") >= 1
    # regrading a submission gives the same grade, check by check: the class's two against the proof set's gradings
    for student, submission in (("alice", "reference"), ("erin", "rank0_trains_alone")):
        again, first = json.loads((out / "results" / f"{student}.json").read_text()), graded[submission]
        assert [(c["name"], c["score"]) for c in again["checks"]] == [(c.name, c.score) for c in first.checks]
        assert again["test_accuracy"] == first.test_accuracy


def test_run_autograder_always_writes_results(tmp_path):
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "train_4gpu.ipynb").write_text("{}")
    out = tmp_path / "results" / "results.json"
    assert cli.main(["gradescope", "--submission", str(submission), "--results", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["score"] == 0 and "notebook" in data["output"] and len(data["tests"]) == len(CHECKS)


def test_self_check_prints_feedback_and_fails_on_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "train_4gpu.py"
    bad.write_text("")
    assert cli.main(["check", str(bad)]) == 1
    out = capsys.readouterr().out
    # one line: what is wrong and what to do; no check listed (hidden ones stay hidden)
    assert out == "train_4gpu.py: not run, 0 / 100 points: train_4gpu.py is empty: submit your train_4gpu.py.\n"


def test_no_feedback_line_accuses_a_correct_script(graded):
    correct = [name for name, (status, failed) in EXPECTED.items() if (status, failed) == ("ok", set())]
    assert {"reference", "sqrt_lr_adam"} <= set(correct)
    assert {name: accusations(graded[name]) for name in correct} == {name: [] for name in correct}
