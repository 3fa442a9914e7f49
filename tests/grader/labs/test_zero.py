"""The ZeRO-1 lab (grader.labs.zero): the stub fails every check, the solution passes all, each mistake its own.

The verdicts are also tested alone (no ranks): what counts as the optimizer's state, and the diagnosis of the
bytes kept and sent.
"""

import os
import re
import subprocess
import sys
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from grader import render
from grader.labs.core import run_lab
from grader.labs.zero import check as zero

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "zero", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "zero", "reference.py")
ALL = [check.name for check in zero.CHECKS]


@pytest.mark.timeout(600)
def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(zero.LAB, STUB)
    assert result.failed() == ALL and result.score == 0
    assert "Not attempted yet: your MyZeRO1Adam still raises NotImplementedError" in render.lab_feedback(result)


@pytest.mark.timeout(900)
def test_the_solution_passes_every_check_visible_and_hidden():
    result = run_lab(zero.LAB, SOLUTION, hidden=True)  # the id "solution"'s variant, then 3 and 2 ranks
    assert result.passed, render.lab_feedback(result)
    assert result.runs == len(zero.LAB.runs) + len(zero.LAB.hidden_runs)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("full_state", ["state_memory"], "4.00x its share of Adam's two moments, 9,192 bytes (± 96 for rounding and step "
     "counters): that is all of Adam's state: every rank stepped the full state"),
    # without the all-gather the ranks disagree, and half the traffic is missing: two checks fail (the third,
    # uneven, waits for matches_adam)
    ("no_all_gather", ["matches_adam", "communication", "uneven"], "the ranks no longer agree"),
    ("floor_shards", ["uneven"], "the last 2 of the 22 parameters (flattened in order) never changed, while DDP + "
     "Adam moved them: no rank's shard covers them. The shard boundaries leave a gap"),
    ("allreduce_then_shard", ["communication"], "1.50x DDP's allreduce of the same gradients"),
    # a rounding bound derived from the arithmetic, and the first parameter beyond it
    ("sums", ["matches_adam", "uneven"], "after step 1 rank 0's parameters differ from DDP + Adam's: the first tensor "
     "that diverges is 1.weight after the optimizer step (parameters, step 1, rank 0): beyond rounding: a bug "
     "(bound "),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment, planted):
    result = run_lab(zero.LAB, planted("zero", attempt))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next(r.message for r in result.checks if not r.passed)
    assert first.startswith("world_size=4, ") and fragment in first, first
    if attempt == "sums":
        assert "check the average (reduce-scatter the sum, then divide by world_size)" in first, first
    if attempt == "no_all_gather":
        messages = {r.name: r.message for r in result.checks}
        assert "only half of ZeRO-1's traffic: all-gather" in messages["communication"]
        assert "not judged until the parameters equal DDP + Adam's" in messages["uneven"]



@pytest.mark.timeout(600)
def test_the_solution_runs_under_torchrun_and_every_rank_ends_with_the_same_parameters():
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          SOLUTION], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    sums = re.findall(r"rank (\d): parameters sum to (\S+) ", run.stdout)
    assert sorted(rank for rank, _ in sums) == ["0", "1"] and len({total for _, total in sums}) == 1, run.stdout

# -- the verdicts alone ---------------------------------------------------------------------------------------------
def test_state_counts_what_the_optimizer_keeps_not_the_model_or_a_wrapped_optimizers_parameters():
    model = nn.Linear(4, 2)  # 10 parameters
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    shard = torch.zeros(3)
    inner = torch.optim.Adam([shard], lr=0.1)
    shard.grad = torch.ones(3)
    inner.step()  # exp_avg, exp_avg_sq (3 floats each) and a step counter (one float) for the shard
    optimizer = types.SimpleNamespace(params=list(model.parameters()), grads=[p.grad for p in model.parameters()],
                                      view=model.weight.data[0], inner=inner, model=model, step_fn=lambda: None,
                                      extra=[torch.zeros(5, dtype=torch.float64)])
    assert zero.state_bytes(optimizer, model) == 3 * 4 * 2 + 4 + 5 * 8


def test_a_view_of_a_kept_buffer_counts_its_whole_storage():
    model = nn.Linear(2, 1)
    whole = torch.zeros(100)
    assert zero.state_bytes(types.SimpleNamespace(mine=whole[:10]), model) == 400


@given(world_size=st.integers(2, 8))
def test_memory_verdicts(world_size):
    moments, tensors = 2 * 4 * 12_000, 6
    share = moments // world_size
    assert zero.judge_memory(share, moments, moments, tensors, world_size, 1).passed
    full = zero.judge_memory(moments, moments * world_size, moments, tensors, world_size, 1)
    assert not full.passed and "every rank stepped the full state" in full.message
    extra = zero.judge_memory(share + share // 2, moments, moments, tensors, world_size, 1)
    assert not extra.passed and "keep only your shard's two moments" in extra.message
    missing = zero.judge_memory(share // 2, moments // 2, moments, tensors, world_size, 0)
    assert not missing.passed and "exactly one rank" in missing.message


@given(world_size=st.integers(2, 8), numel=st.integers(1_000, 100_000))
def test_communication_verdicts(world_size, numel):
    ddp = 2 * (world_size - 1) / world_size * 4 * numel
    assert zero.judge_communication([ddp, ddp], numel, 6, world_size).passed
    assert "reduce-scatter them instead" in zero.judge_communication([ddp, 1.5 * ddp], numel, 6, world_size).message
    assert "all-gather the updated parameters" in zero.judge_communication([ddp / 2], numel, 6, world_size).message
    assert "no collective was called" in zero.judge_communication([0.0], numel, 6, world_size).message
