"""grader.checks: on a synthetic perfect run every check passes; each defect fails exactly its check."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from grader.assignment import ASSIGNMENT
from grader.checks import CHECKS
from grader.checks.outputs import HELD_OUT
from grader.evidence import GRADER_FAULT, Evidence, collect, fingerprints_equal
from grader.inrank import records
from grader.replay import Comparison, compare

pytestmark = pytest.mark.unit6
N, W, B, STEPS_PER_EPOCH, EPOCHS = 1197, 4, 32, 10, 2
KINDS = {"steps": "step", "inits": "init", "ends": "end", "reports": "report", "saves": "save", "writes": "write",
         "collectives": "collective", "tampers": "tamper", "shutdowns": "shutdown", "initials": "initial",
         "forgeries": "forgery", "probe_errors": "probe_error", "calls": "call", "messages": "messages",
         "waits": "wait"}


class Run(SimpleNamespace):
    """A run's records as the JSON objects the probes write (without kind and rank), per rank, and its outcome:
    mutable, for the defects below; :func:`freeze` turns it into the :class:`Evidence` the checks read."""

    def __init__(self, world_size: int, expected_backend: str, train_size: int = 0, status: str = "ok") -> None:
        super().__init__(world_size=world_size, expected_backend=expected_backend, train_size=train_size,
                         status=status, exits={}, misattributed=0, test_accuracy=None, checkpoint_val_accuracy=None,
                         checkpoint_fingerprint=None, checkpoint_error=None, comparisons=[],
                         checkpoint_foreign=False, checkpoint_step=None,
                         **{name: {} for name in KINDS})

    @property
    def ranks(self) -> range:
        return range(self.world_size)


def freeze(run: Run) -> Evidence:
    """The evidence of ``run``, every record parsed as the grader parses the channel's."""
    typed = {name: {r: [records.parse({"kind": kind, "rank": r, **d}) for d in lst]
                    for r, lst in getattr(run, name).items()} for name, kind in KINDS.items()}
    exits = {r: records.parse({"kind": "rank_exit", "rank": r, **e}) for r, e in run.exits.items()}
    outcome = {k: v for k, v in vars(run).items() if k not in KINDS and k != "exits"}
    return Evidence(**typed, exits=exits, **outcome)


def shards(epoch: int) -> list[list[int]]:
    order = torch.randperm(N, generator=torch.Generator().manual_seed(epoch)).tolist()
    order += order[: 1200 - N]  # DistributedSampler pads to a multiple of world_size
    return [order[r::W] for r in range(W)]


def perfect_run() -> Run:
    ev = Run(world_size=W, expected_backend="gloo", train_size=N)
    for r in ev.ranks:
        ev.inits[r] = [{"kind": "init", "rank": r, "backend": "gloo", "world_size": W, "local_rank": r}]
        ev.initials[r] = [{"fingerprint": [1.0, 2.0, 3.0, 4.0, 5.0], "device": "cpu"}]
        ev.shutdowns[r] = [{"kind": "shutdown", "steps": EPOCHS * STEPS_PER_EPOCH}]
        ev.ends[r] = [{"kind": "end", "how": "returned", "exit_code": 0, "steps": EPOCHS * STEPS_PER_EPOCH,
                       "error": None, "digests": None}]
        ev.exits[r] = {"returncode": 0, "stdout_bytes": 300 if r == 0 else 0, "stdout": ""}
        ev.steps[r] = []
        for epoch in range(EPOCHS):
            mine = shards(epoch)[r]
            for s in range(STEPS_PER_EPOCH):
                number = epoch * STEPS_PER_EPOCH + s + 1
                ev.steps[r].append({"step": number, "epoch": epoch, "indices": mine[s * B:(s + 1) * B],
                                    "lr": [0.008 * min(1.0, number / 10)], "fingerprint": [float(number)] * 5})
    last = EPOCHS * STEPS_PER_EPOCH
    ev.saves[0] = [{"path": "/run/checkpoint.pt", "step": last}]
    ev.reports[0] = [{"epoch": e, "val_accuracy": 0.9, "true_val_accuracy": 0.9000001,
                      "step": (e + 1) * STEPS_PER_EPOCH, "seq": 1000 + 2 * e + 1} for e in range(EPOCHS)]
    ev.collectives[0] = [{"op": "all_reduce", "step": (e + 1) * STEPS_PER_EPOCH, "seq": 1000 + 2 * e}
                         for e in range(EPOCHS)]  # the metrics' reduction, just before each report
    ev.test_accuracy, ev.checkpoint_val_accuracy, ev.checkpoint_fingerprint = 0.97, 0.9, [float(last)] * 5
    ev.comparisons = [Comparison(1, 1e-7, 1.0), Comparison(2, 2e-7, 1.0)]
    return ev


def failures(ev: Run) -> set[str]:
    evidence = freeze(ev)
    return {c.name for c in CHECKS if c.test(evidence, ASSIGNMENT)[0] is False}


def unassessed(ev: Run) -> set[str]:
    """The checks that cannot be assessed on ``ev`` (neither pass nor fail)."""
    evidence = freeze(ev)
    return {c.name for c in CHECKS if c.test(evidence, ASSIGNMENT)[0] is None}


def test_the_rubric_is_declared_once_with_points_and_visibility():
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names))
    assert sum(c.points for c in CHECKS) == 100
    assert {c.visibility for c in CHECKS} <= {"visible", "after_published", "hidden"}


def test_a_perfect_run_passes_everything():
    ev = perfect_run()
    assert failures(ev) == set()


def defect(name):
    ev = perfect_run()
    if name == "same_data":
        for r in ev.ranks:
            for s, step in enumerate(ev.steps[r]):
                step["indices"] = ev.steps[0][s]["indices"]
    elif name == "no_set_epoch":
        for r in ev.ranks:
            for s in range(STEPS_PER_EPOCH):
                ev.steps[r][STEPS_PER_EPOCH + s]["indices"] = ev.steps[r][s]["indices"]
    elif name == "diverged":
        ev.steps[2][5]["fingerprint"] = [9.0] * 5
    elif name == "summed":
        ev.comparisons = [Comparison(1, 3.0, 4.0)]
    elif name == "unscaled":
        for r in ev.ranks:
            for step in ev.steps[r]:
                step["lr"] = [0.002 * min(1.0, step["step"] / 10)]
    elif name == "no_warmup":
        for step in ev.steps[0]:
            step["lr"] = [0.008]
    elif name == "every_rank_saves":
        ev.saves[3] = [{"path": "/run/checkpoint.pt", "step": 20}]
    elif name == "ranks_print":
        ev.exits[1]["stdout_bytes"] = 40
    elif name == "not_averaged":
        ev.reports[0][1]["val_accuracy"] = 0.95
    elif name == "low_accuracy":
        ev.test_accuracy = 0.5
    elif name == "tampered":
        ev.tampers[0] = [{"name": "torch.distributed.all_reduce", "step": 3}]
    elif name == "no_shutdown":
        del ev.shutdowns[3]
    elif name == "wrong_device":
        ev.expected_backend = "nccl"
        for r in ev.ranks:
            ev.inits[r][0]["backend"] = "nccl"
            ev.initials[r][0]["device"] = "cuda:0"
    elif name == "forged_report":  # signed by rank 0's own writer, so the channel let it through
        ev.reports[0].append({"epoch": 1, "val_accuracy": 0.99, "true_val_accuracy": 0.99, "step": 20})
    elif name == "checkpoint_not_trained":
        ev.checkpoint_fingerprint = [7.0] * 5
    elif name == "forgery":
        ev.forgeries[2] = [{"via": "Probes.emit", "caller": "/run/train_4gpu.py", "forged_kind": "report"}]
    elif name == "misattributed":
        ev.misattributed = 1
    elif name == "over_budget":  # one more step in each of epochs 2..6: 7 epochs of a budget of 6
        for r in ev.ranks:
            ev.steps[r] += [{**ev.steps[r][-1], "step": 19 + e, "epoch": e} for e in range(2, 7)]
    elif name == "no_checkpoint":
        ev.saves, ev.test_accuracy, ev.checkpoint_error = {}, None, "no checkpoint at checkpoint.pt"
        ev.checkpoint_val_accuracy = ev.checkpoint_fingerprint = None
    elif name == "unreduced":  # each rank scored the whole validation split: right numbers, nothing reduced
        ev.collectives[0] = []
    elif name == "short_batch_unaveraged":  # step 10, epoch 0's last (12 samples per rank), was not averaged
        for r in (1, 2, 3):
            ev.steps[r][STEPS_PER_EPOCH - 1]["fingerprint"] = [9.0 + r] * 5
    elif name == "divided_twice":
        ev.comparisons = [Comparison(1, 0.75, 0.25)]
    elif name == "foreign_checkpoint":
        ev.test_accuracy, ev.checkpoint_foreign = None, True
        ev.checkpoint_error = "checkpoint.pt does not hold the parameters rank 0's optimizer produced."
    elif name == "diverged_at_start":
        ev.initials[1][0]["fingerprint"] = [9.0] * 5
    elif name == "scaled":  # the loss halved on every rank: the averaged gradient, half as long at every step
        ev.comparisons = [compare(s, 0.5 * g, g) for s, g in enumerate(GRADIENTS, 1)]
    elif name == "one_way_messages":  # rank 0 sent its number to the others and received nothing
        ev.collectives[0] = []
        ring_messages(ev, lambda r: ([1, 2, 3], []) if r == 0 else ([], [0]))
    elif name == "stale_checkpoint":  # a copy of the parameters 3 steps before the last, saved at the end
        ev.checkpoint_step, ev.checkpoint_fingerprint, ev.checkpoint_val_accuracy = 17, [17.0] * 5, 0.7
    return ev


# rank 0's gradients at two steps, and a clipping norm shorter than both
GRADIENTS = [torch.randn(500, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]


def ring_messages(ev: Run, peers) -> None:
    """Instead of an all_reduce before each report, messages: ``peers(rank) -> (sent_to, received_from)``."""
    for r in ev.ranks:
        sent, received = peers(r)
        ev.messages[r] = [{"step": report["step"], "sent_to": sent, "received_from": received,
                           "seq": report["seq"] - 1 if r == 0 else None} for report in ev.reports[0]]


@pytest.mark.parametrize("name, failed, phrase", [
    # identical ranks stay identical: their equal parameters and gradients show no averaging
    ("same_data", {"disjoint_shards", "reshuffled"}, "ranks 1–3 saw the same samples as rank 0"),
    ("no_set_epoch", {"reshuffled"}, "set_epoch"),
    ("diverged", {"equal_parameters"}, "after step 6"),
    ("summed", {"matches_single_process"}, "4.00x"),
    ("unscaled", {"lr_scaled"}, "linear 0.008"),
    ("no_warmup", {"lr_scaled"}, "warm it up"),
    ("every_rank_saves", {"rank0_checkpoint_and_logs"}, "rank 0 only"),
    ("ranks_print", {"rank0_checkpoint_and_logs"}, "rank 1 printed"),
    ("not_averaged", {"metrics_averaged"}, "reported val_accuracy 0.9500"),
    ("low_accuracy", {"target_accuracy"}, "0.500"),
    ("tampered", {"integrity"}, "torch.distributed.all_reduce"),
    ("no_shutdown", {"ran_to_the_end"}, "shut down cleanly"),
    ("wrong_device", {"ran_to_the_end"}, "rank 1 (LOCAL_RANK=1) trained on cuda:0, expected cuda:1"),
    ("forged_report", {"metrics_averaged", "integrity"}, "reported val_accuracy 0.9900"),
    ("checkpoint_not_trained", {"integrity"}, "not those rank 0's optimizer held after step 20"),
    ("forgery", {"integrity"}, "called the grader's probes itself"),
    ("misattributed", {"integrity"}, "forged lines"),
    ("over_budget", {"target_accuracy"}, "trained 7 epochs; the budget is 6"),
    ("no_checkpoint", {"target_accuracy"}, "no checkpoint"),
    ("unreduced", {"metrics_averaged"}, "without combining anything across ranks"),
    ("short_batch_unaveraged", {"equal_parameters"}, "step 10 was the short last batch of an epoch: 12 samples"),
    ("divided_twice", {"matches_single_process"}, "divided by world_size twice"),
    ("foreign_checkpoint", {"target_accuracy", "integrity"}, "does not hold the parameters"),
    ("scaled", {"matches_single_process"}, "then multiplied by 0.50 on every rank"),
    ("one_way_messages", {"metrics_averaged"}, "no messages that brought every rank's numbers to rank 0"),
    ("stale_checkpoint", {"target_accuracy"}, "parameters rank 0 had after step 17, not after its last step 20"),
])
def test_each_defect_fails_exactly_its_check_and_says_why(name, failed, phrase):
    ev = defect(name)
    assert failures(ev) == failed
    check = next(c for c in CHECKS if c.name in failed)
    assert phrase in check.test(freeze(ev), ASSIGNMENT)[1]


def test_metrics_are_not_blamed_when_the_ranks_diverged():
    ev = defect("diverged_at_start")
    ev.reports[0][0]["val_accuracy"] = 0.5  # an average over different models: not rank 0's model's accuracy
    assert failures(ev) == {"equal_parameters"}
    assert unassessed(ev) == {"metrics_averaged"}
    passed, message = next(c for c in CHECKS if c.name == "metrics_averaged").test(freeze(ev), ASSIGNMENT)
    assert passed is None and message.startswith("cannot be assessed: the ranks held different parameters")


def test_a_failed_run_fails_ran_to_the_end_with_its_status():
    ev = perfect_run()
    ev.status = "hang on rank 3"
    passed, message = CHECKS[0].test(freeze(ev), ASSIGNMENT)
    assert not passed and "hang on rank 3" in message


def test_fingerprints_tolerate_rounding_only():
    assert fingerprints_equal([1.0, 1e6], [1.0 + 1e-9, 1e6 + 1e-3])
    assert not fingerprints_equal([1.0, 2.0], [1.0, 2.1])
    assert not fingerprints_equal([1.0], [1.0, 2.0])


STEP = {"kind": "step", "step": 1, "epoch": 0, "indices": [3, 5], "lr": [0.1], "fingerprint": [1.0]}


def test_records_must_come_from_their_signer():
    raw = [{"kind": "rank_exit", "rank": 1, "returncode": 0, "signer": 1},  # a rank faking its exit
           {**STEP, "rank": 2, "signer": 1},  # rank 1 signing as rank 2
           {"kind": "rank_exit", "rank": 1, "returncode": 3, "signer": "launcher"},
           {**STEP, "rank": 1, "signer": 1}]
    ev = collect(raw, world_size=W)
    assert ev.misattributed == 2 and ev.exits[1].returncode == 3 and list(ev.steps) == [1]
    assert ev.steps[1][0] == records.Step(rank=1, signer=1, step=1, epoch=0, indices=(3, 5), lr=(0.1,),
                                          fingerprint=(1.0,))


@pytest.mark.parametrize("forged, says", [
    ({**STEP, "indices": "all of them"}, "'step' record of rank 1: field 'indices' should be a list of int, got str"),
    ({**STEP, "kind": "steps"}, "'steps' record of rank 1: unknown kind"),
    ({**STEP, "lr": [True]}, "field 'lr' should be a list of float, got list [true]"),
    ({**STEP, "grads": 7}, "field 'grads' should be str or null, got int 7"),
    ({**STEP, "accuracy": 1.0}, "unexpected field(s) accuracy"),
    ({"kind": "step", "step": 1}, "field 'epoch' is missing"),
    ({**STEP, "v": 2}, "format version 2, this grader reads version 1"),
])
def test_a_malformed_record_fails_integrity_alone_and_says_what_was_wrong(forged, says):
    """A record signed with rank 1's key (its process reached its writer) that does not fit the format: refused,
    counted against integrity, never a traceback in the checks nor a change to any other check's verdict."""
    run = perfect_run()
    ev = collect([{**forged, "rank": 1, "signer": 1}], world_size=W)
    assert ev.malformed and says in ev.malformed[0] and not ev.steps
    evidence = dataclasses.replace(freeze(run), malformed=ev.malformed)
    failed = {c.name: c.test(evidence, ASSIGNMENT)[1] for c in CHECKS if not c.test(evidence, ASSIGNMENT)[0]}
    assert list(failed) == ["integrity"] and says in failed["integrity"] and "were refused" in failed["integrity"]


def outcome(ev: Run, name: str) -> tuple[bool, str]:
    return next(c for c in CHECKS if c.name == name).test(freeze(ev), ASSIGNMENT)


def test_identical_ranks_get_no_credit_for_averaging_and_are_told_what_is_needed():
    ev = defect("same_data")  # the skeleton with init_from_env(): every rank trains rank 0's model on its batches
    for name in ("equal_parameters", "matches_single_process", "reshuffled"):
        passed, message = outcome(ev, name)
        assert not passed and "needs each rank to" in message and "see disjoint shards" in message, name
    assert unassessed(ev) == {"equal_parameters", "matches_single_process"}  # cannot be seen: neither way


@pytest.mark.parametrize("precision, error, passes", [(None, 1e-4, True), (None, 3e-2, False),
                                                      ("bfloat16", 3e-2, True), ("bfloat16", 0.5, False)])
def test_the_replay_tolerance_follows_the_precision_trained_in(precision, error, passes):
    ev = perfect_run()
    ev.comparisons = [Comparison(1, error, 1.0)]
    for step in ev.steps[0]:
        step["precision"] = precision
    passed, message = outcome(ev, "matches_single_process")
    assert passed is passes, message
    if not passes:  # the measured scale of the gradient is right: not "summed", not "the same parameters"
        assert "1.00x" in message and "not combined" in message and "summed" not in message


def only_rank0_trains(status: str = "ok") -> Run:
    ev = perfect_run()
    ev.status = status
    for r in (1, 2, 3):
        del ev.steps[r], ev.initials[r]
    ev.comparisons = [Comparison(1, 1e-7, 1.0)]  # the union batch is rank 0's alone: it matches trivially
    return ev


def test_when_only_rank_0_trains_the_cause_is_named_and_the_union_batch_is_not_credited():
    ev = only_rank0_trains()
    assert {"ran_to_the_end", "disjoint_shards", "reshuffled", "equal_parameters", "matches_single_process",
            "lr_scaled"} <= failures(ev)
    assert "ranks 1–3 took no optimizer step" in outcome(ev, "ran_to_the_end")[1]
    passed, message = outcome(ev, "matches_single_process")
    assert not passed and "needs every rank to train: ranks 1–3 took no optimizer step" in message
    crashed = only_rank0_trains("crash on rank 0")  # rank 0 then failed in a collective its peers had left
    assert "ranks 1–3 took no optimizer step" in outcome(crashed, "ran_to_the_end")[1]


@pytest.mark.parametrize("status", ["crash on rank 2", "hang on rank 3", "timeout"])
def test_checks_that_a_crash_left_without_evidence_say_not_assessed_and_give_no_advice(status):
    ev = Run(world_size=W, expected_backend="gloo", train_size=N, status=status)
    for r in ev.ranks:
        ev.inits[r] = [{"kind": "init", "rank": r, "backend": "gloo", "world_size": W, "local_rank": r}]
    ev.checkpoint_error = "no checkpoint at checkpoint.pt: save model.state_dict() there on rank 0 after training."
    for check in CHECKS[1:]:
        passed, message = check.test(freeze(ev), ASSIGNMENT)
        if check.name != "integrity":
            assert not passed and message.startswith(f"not assessed: the run did not finish ({status})"), check.name
        assert not any(advice in message for advice in ("data.load", "epoch budget", "never called report",
                                                          "save model", "DistributedSampler")), check.name


def with_lr(ev: Run, peak: float, optimizer: str) -> Run:
    for r in ev.ranks:
        for step in ev.steps[r]:
            step["lr"], step["optimizer"] = [peak * min(1.0, step["step"] / 10)], optimizer
    return ev


@pytest.mark.parametrize("peak, optimizer, rule", [(0.004, "Adam", "sqrt"), (0.004, "AdamW", "sqrt"),
                                                   (0.008, "Adam", "linear"), (0.008, "SGD", "linear")])
def test_every_scaling_rule_the_course_teaches_for_the_optimizer_passes_and_is_named(peak, optimizer, rule):
    passed, message = outcome(with_lr(perfect_run(), peak, optimizer), "lr_scaled")
    assert passed and f"by the {rule} rule ({optimizer})" in message


def test_the_square_root_rule_is_not_accepted_for_sgd():
    passed, message = outcome(with_lr(perfect_run(), 0.004, "SGD"), "lr_scaled")
    assert not passed and "linear 0.008" in message and "sqrt" not in message
    passed, message = outcome(with_lr(perfect_run(), 0.002, "Adam"), "lr_scaled")
    assert not passed and "linear 0.008 or sqrt 0.004" in message


def test_processes_that_never_joined_a_group_are_not_told_about_averaged_samples():
    ev = perfect_run()  # nn.DataParallel in one process: 4 processes, no process group, 128 samples per step
    ev.inits = {}
    for r in ev.ranks:
        ev.steps[r] = [{**step, "indices": list(range(128))} for step in ev.steps[0]]
    passed, message = outcome(ev, "lr_scaled")
    assert not passed and "512" not in message and "averages" not in message
    assert "ranks 0–3 never joined a process group" in message and "nn.DataParallel" in message
    passed, message = outcome(ev, "equal_parameters")
    assert not passed and "needs the ranks to join one process group" in message


def test_the_rank_0_check_points_to_target_accuracy_only_when_there_is_no_checkpoint():
    ev = perfect_run()
    del ev.saves[0]  # written some way torch.save did not see; the grader evaluated it anyway
    assert "target accuracy" not in outcome(ev, "rank0_checkpoint_and_logs")[1]
    ev.test_accuracy = None
    assert "see target accuracy" in outcome(ev, "rank0_checkpoint_and_logs")[1]


def test_a_checkpoint_the_recorded_training_did_not_produce_is_flagged_for_review():
    passed, message = outcome(defect("foreign_checkpoint"), "integrity")
    assert passed is False and "recorded optimizer steps did not produce" in message and "review" in message


def test_the_target_check_explains_why_the_self_check_and_class_grade_accuracies_differ():
    """Pass or fail, the target's message says the held-out copy is drawn from the grading machine's secret (the
    self-check's accuracy is not the class grade's); a check without a checkpoint has no accuracy to explain."""
    assert "`grader check` on your machine and the class grade score slightly different copies" in HELD_OUT
    for name in ("low_accuracy", None):
        ev = defect(name) if name else perfect_run()
        assert outcome(ev, "target_accuracy")[1].endswith(HELD_OUT), name
    assert HELD_OUT not in outcome(defect("no_checkpoint"), "target_accuracy")[1]


def test_gradients_clipped_the_same_way_on_every_rank_pass_and_the_clipping_is_named():
    """clip_grad_norm_ after the averaging shortens rank 0's gradient to one norm; the direction is the union
    batch's. A step whose gradient was already shorter is left alone."""
    ev = perfect_run()
    norm = 0.5 * min(float(g.norm()) for g in GRADIENTS)
    ev.comparisons = [compare(s, g * norm / float(g.norm()), g) for s, g in enumerate(GRADIENTS, 1)]
    passed, message = outcome(ev, "matches_single_process")
    assert passed and f"clipped to norm {norm:.3g} on every rank (clip_grad_norm_)" in message
    assert "not averaged" not in message
    long = max(GRADIENTS, key=lambda g: float(g.norm()))
    ev.comparisons = [compare(1, long * norm / float(long.norm()), long), compare(2, 0.01 * long / 2, 0.01 * long / 2)]
    assert outcome(ev, "matches_single_process")[0]
    other = GRADIENTS[0] + 0.5 * GRADIENTS[1]  # shortened, but pointing elsewhere: not clipping
    ev.comparisons = [compare(1, other * norm / float(other.norm()), GRADIENTS[0])]
    passed, message = outcome(ev, "matches_single_process")
    assert not passed and "clip" not in message


@pytest.mark.parametrize("peers", [
    lambda r: ([(r + 1) % W], [(r - 1) % W]),  # a ring: rank 0 hears from rank 3, which heard from 2, ...
    lambda r: ([0], []) if r else ([], [1, 2, 3]),  # every rank sends to rank 0
])
def test_metrics_combined_by_point_to_point_messages_count_as_reduced(peers):
    ev = perfect_run()
    ev.collectives[0] = []
    ring_messages(ev, peers)
    assert failures(ev) == set()
    unmatched = perfect_run()  # rank 3 says it sent to rank 0, but rank 0 received from no one
    unmatched.collectives[0] = []
    ring_messages(unmatched, lambda r: ([0], []) if r else ([], []))
    assert failures(unmatched) == {"metrics_averaged"}


def test_a_stale_checkpoint_is_a_mistake_not_tampering_and_the_metrics_are_not_blamed():
    ev = defect("stale_checkpoint")
    assert outcome(ev, "integrity")[0] and outcome(ev, "metrics_averaged")[0]
    message = outcome(ev, "target_accuracy")[1]
    assert "not the final model" in message and "averag" not in message


def test_the_metrics_advice_shards_without_repeated_samples():
    message = outcome(defect("not_averaged"), "metrics_averaged")[1]
    assert "dataset[rank::world_size]" in message and "shuffle=False" not in message
    assert "Sum both counts across ranks" in message


def test_an_earlier_epochs_checkpoint_is_graded_as_the_students_model_and_said_so():
    """A best-epoch checkpoint (the end of epoch 0, step 10 of 20) is the student's model; a mid-epoch one is not."""
    ev = perfect_run()
    ev.checkpoint_step, ev.checkpoint_fingerprint = STEPS_PER_EPOCH, [float(STEPS_PER_EPOCH)] * 5
    passed, message = outcome(ev, "target_accuracy")
    assert passed and "at the end of epoch 0 (step 10 of 20" in message and "graded as your model" in message
    assert failures(ev) == set()
    assert "not the final model" in outcome(defect("stale_checkpoint"), "target_accuracy")[1]


def test_an_averaged_checkpoint_is_graded_as_the_students_model_and_not_flagged():
    ev = perfect_run()
    ev.checkpoint_relation = "an exponential moving average (EMA, decay 0.9) of rank 0's weights"
    ev.checkpoint_fingerprint, ev.checkpoint_val_accuracy = [18.5] * 5, 0.93  # no one step's, no report's
    passed, message = outcome(ev, "target_accuracy")
    assert passed and message.startswith("your checkpoint is an exponential moving average (EMA, decay 0.9)")
    assert failures(ev) == set() and outcome(ev, "integrity")[0]


def test_samples_the_grader_could_not_recognise_leave_the_data_checks_not_assessed():
    """No rank's steps name a training sample (inputs changed before the forward): nothing false is said."""
    ev = perfect_run()
    for r in ev.ranks:
        ev.steps[r] = [{**s, "indices": [], "epoch": -1} for s in ev.steps[r]]
    assert {"disjoint_shards", "reshuffled", "equal_parameters", "matches_single_process", "lr_scaled"} <= \
        unassessed(ev)
    message = outcome(ev, "disjoint_shards")[1]
    assert "could not tell which training samples ranks 0–3 trained on" in message and "same samples" not in message


def test_a_replay_the_grader_itself_failed_is_not_assessed_and_quotes_no_exception():
    ev = perfect_run()
    ev.comparisons, ev.replay_error = [], GRADER_FAULT
    assert unassessed(ev) == {"matches_single_process"}
    assert "a fault of the grader, not of your script" in outcome(ev, "matches_single_process")[1]


@pytest.mark.parametrize("op", ["all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "all_gather",
                                "all_gather_object"])
def test_every_name_of_a_combining_collective_counts_as_combining(op):
    """Which collectives combine is read from the one table (course.runtime.collective_names): torch 2.13's new
    names count, as the old ones do; a broadcast does not."""
    ev = perfect_run()
    for record in ev.collectives[0]:
        record["op"] = op
    assert failures(ev) == set()
    for record in ev.collectives[0]:
        record["op"] = "broadcast"
    assert failures(ev) == {"metrics_averaged"}
