"""The FSDP lab (grader.labs.fsdp): the stub fails every check, the solution passes all, each mistake its own.

The solution prefetches (the stretch goal). The three older mistakes are made on a solution that does not, so each
also misses the stretch goal; the solution without prefetch passes every other check. The verdicts are also tested
alone on numbers built by hand (no ranks).
"""

import os

import pytest

from grader import render
from grader.labs.core import run_lab
from grader.labs.fsdp import check as fsdp

pytestmark = [pytest.mark.unit7, pytest.mark.timeout(600)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "fsdp", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "fsdp", "reference.py")
ALL = [check.name for check in fsdp.CHECKS]


def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(fsdp.LAB, STUB)
    assert result.failed() == ALL and result.runs == 0
    assert "Not attempted yet: your MyFSDP still raises NotImplementedError" in render.lab_feedback(result)


def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(fsdp.LAB, SOLUTION, hidden=True)  # 4 ranks, then 3 and 2 with seeds drawn now
    assert result.passed, render.lab_feedback(result)


@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("keeps_gathered", ["memory", "communication", "prefetch"], "18,352 bytes of gathered parameters were alive at "
     "once"),
    ("allreduce_grads", ["communication", "prefetch"], "2.00x DDP's allreduce of the same model (27,528); FSDP sends "
     "1.5x"),
    ("sums", ["matches_adam", "prefetch"], "divide the reduce-scattered sum by world_size"),
    ("no_prefetch", ["prefetch"], "every all-gather was blocking, so each layer waited for its parameters"),
    ("waits_at_once", ["prefetch"], "step 1, forward: 0 of 4 all-gathers ran while a layer computed; you waited for "
     "each asynchronous all-gather before any layer computed"),
    # each future waited for as it is issued, the handle again later: judged by the first wait, not the last
    ("waits_on_futures", ["prefetch"], "you waited for each asynchronous all-gather before any layer computed"),
    # the list form of dist.all_gather is watched like the tensor forms: right when used right, caught when kept
    ("list_all_gather", [], ""),
    ("list_keeps_gathered", ["memory"], "bytes of gathered parameters were alive at once; prefetching holds two"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment, planted):
    result = run_lab(fsdp.LAB, planted("fsdp", attempt))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next((r.message for r in result.checks if not r.passed), "world_size=4, ")
    assert first.startswith("world_size=4, ") and fragment in first, first
    if "matches_adam" in failed:  # a rounding bound derived from the arithmetic, and the first parameter beyond it
        assert "the first tensor that diverges is 1.weight after the optimizer step (parameters, step 1, rank 0): " \
               "beyond rounding: a bug (bound " in first, first


def test_torch_fsdp_is_refused_without_starting_a_rank(tmp_path):
    path = tmp_path / "fsdp.py"
    path.write_text("from torch.distributed.fsdp import fully_shard\n\nMyFSDP = fully_shard\n")
    result = run_lab(fsdp.LAB, str(path))
    assert result.failed() == ALL and result.runs == 0
    assert "your file uses torch.distributed.fsdp.fully_shard" in result.checks[0].message


def test_each_variant_is_an_mlp_of_its_own_width_and_depth():
    from grader.labs import variant

    model = fsdp._model({"seed": 0, "hidden": 40, "layers": 5})
    linears = fsdp._linears(model)
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 40)] + [(40, 40)] * 3 + [(40, fsdp.CLASSES)]
    assert len(fsdp._linears(fsdp._model({"seed": 0}))) == 4  # the published model
    assert variant.variant_runs(fsdp.LAB, "solution")[0]["hidden"] != fsdp.LAB.runs[0]["hidden"]


def test_memory_passes_one_layer_and_fails_two():
    assert fsdp.judge_memory(4588, 8320, 18352, 8320, 4).passed
    two = fsdp.judge_memory(4588, 12544, 18352, 8320, 4)
    assert not two.passed and "1.5 layers' worth" in two.message
    assert "keep only your pieces" in fsdp.judge_memory(18352, 8320, 18352, 8320, 4).message


def test_memory_allows_two_layers_to_a_prefetch_and_no_more():
    assert fsdp.judge_memory(4588, 12544, 18352, 8320, 4, prefetched=True, two_layers_bytes=12544).passed
    three = fsdp.judge_memory(4588, 16768, 18352, 8320, 4, prefetched=True, two_layers_bytes=12544)
    assert not three.passed and "prefetching holds two layers" in three.message


def test_prefetch_counts_the_gathers_a_matmul_ran_inside():
    overlapped = [(0.0, 1.0, True), (1.0, 3.0, True), (3.0, 5.0, True)]  # matmuls at 2 and 4: the last two overlap
    assert fsdp.judge_prefetch([fsdp.Overlap(1, "forward", overlapped, [0.5, 2.0, 4.0])]).passed
    waited = [(0.0, 0.1, True), (1.0, 1.1, True), (3.0, 3.1, True)]
    missed = fsdp.judge_prefetch([fsdp.Overlap(2, "backward", waited, [0.5, 2.0, 4.0])])
    assert not missed.passed and missed.message.startswith("step 2, backward: 0 of 3 all-gathers")
    blocking = fsdp.judge_prefetch([fsdp.Overlap(1, "forward", [(0.0, 0.1, False)] * 2, [2.0])])
    assert "every all-gather was blocking" in blocking.message


def test_communication_is_one_and_a_half_ddp_within_the_padding():
    ddp = 2 * 3 / 4 * 18352
    assert fsdp.judge_communication([1.5 * ddp], 18352, 4, 4).passed
    assert "reduce-scatter them instead" in fsdp.judge_communication([2 * ddp], 18352, 4, 4).message
    assert "one all-gather too few" in fsdp.judge_communication([ddp], 18352, 4, 4).message


@pytest.mark.timeout(600)
def test_the_self_check_without_an_id_also_runs_3_ranks_and_names_an_even_split(planted):
    result = run_lab(fsdp.LAB, planted("fsdp", "assumes_even_split"))  # 64*32+32 = 2080 divides by 4, not 3
    assert result.failed() and result.runs == 2, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert first.startswith("your code assumes 4 ranks, or that each layer's length divides evenly by the world "
                            "size: it passes the published run, not this one with 3 ranks."), first
