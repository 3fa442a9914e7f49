"""The ring lab (grader.labs.ring): the stub fails every check, the solution passes all, each mistake fails its own.

The solution is also compared with dist.all_reduce on inputs hypothesis draws (world sizes 2-8, any length, every
dtype and op).
"""

import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grader import render
from grader.labs.core import run_lab
from grader.labs.ring import check as ring

pytestmark = [pytest.mark.timeout(600), pytest.mark.unit4]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STUB = os.path.join(ROOT, "grader", "labs", "ring", "stub.py")
SOLUTION = os.path.join(ROOT, "grader", "labs", "ring", "reference.py")
ALL = [check.name for check in ring.CHECKS]
# the first visible run (4 ranks) has every dtype and op, and lengths below and not divisible by 4: enough for a mistake
FIRST_RUN = dataclasses.replace(ring.LAB, runs=ring.LAB.runs[:1])


def test_the_stub_fails_every_check_as_not_attempted():
    result = run_lab(ring.LAB, STUB)
    assert result.failed() == ALL and result.score == 0
    assert result.runs == 0  # the packaged stub, byte for byte: no rank needs to start to say so
    assert "Not attempted yet: your ring_allreduce still raises NotImplementedError" in render.lab_feedback(result)


def test_the_solution_passes_every_check_visible_and_hidden():
    assert run_lab(ring.LAB, SOLUTION).passed
    hidden = run_lab(ring.LAB, SOLUTION, hidden=True)  # world sizes 2, 5 and 8, a seed drawn now
    assert hidden.passed, render.lab_feedback(hidden)
    assert hidden.runs == len(ring.LAB.runs) + len(ring.LAB.hidden_runs)


@pytest.mark.parametrize(("attempt", "failed", "fragment"), [
    ("blocking_send_recv", [], ""),  # right, with blocking messages: torch's send calls isend, counted once
    ("counter_clockwise", [], ""),  # right: the ring runs the other way round (to the left, from the right)
    ("adds_own_chunk_twice", ["matches"],
     # chunk 0 is completed on rank 3, which adds its own input once more
     "the first wrong message is step 4 (all-gather): rank 0 sent chunk 1 to rank 1. "
     "rank 0's chunk 0 (elements 0-250) is off by -4 at element 0 (got 2, expected 6) after the reduce-scatter: every "
     "rank has this chunk wrong, so the all-gather only passed the mistake on; it is off by exactly rank 3's input: "
     "rank 3's chunk was added twice (it looks like a rank added its own chunk twice"),
    ("calls_all_reduce", ["point_to_point_only", "bytes", "steps"],
     "rank 0 called dist.all_reduce (a collective): the lab asks for the ring from send/recv (or isend/irecv) only"),
    ("barrier_at_end", ["point_to_point_only"], "called dist.barrier (a collective)"),
    ("forgets_average", ["matches"], "it holds the sum, not the average: op='avg' divides the sum by world_size once"),
    ("averages_twice", ["matches"], "it was divided by world_size twice: divide once, after the all-gather"),
    ("sends_to_owner", ["neighbours"], "rank 0's message 2 was sent to rank 2; in a ring rank 0 sends only to its "
     "right neighbour, rank 1, and receives only from its left one, rank 3"),
    ("imports_course", ALL, "your file uses course.collectives.allreduce.ring_allreduce, a ready-made version of "
     "what this lab asks you to write"),
    ("chunk_off_by_one", ALL, "1001 float32 elements, op='sum': the chunk indices of sender and receiver disagree at "
     "step 1 of the all-gather: rank 3 sends a chunk of 251 elements and rank 0 receives it into a chunk of 250"),
    ("sends_whole_tensor", ["bytes"], "rank 0 sent 15,016 bytes; a ring sends 2(n-1)/n of the 4,004-byte tensor = "
     "6,006 bytes: 3 of its 6 messages carried the whole tensor instead of one chunk (1/n of it)"),
])
def test_each_wrong_attempt_fails_exactly_its_check_and_says_why(attempt, failed, fragment, planted):
    result = run_lab(FIRST_RUN, planted("ring", attempt))
    assert result.failed() == failed, render.lab_feedback(result)
    first = next((r.message for r in result.checks if not r.passed), "world_size=4: ")
    assert first.startswith("world_size=4: ") and fragment in first, first


CASE = st.tuples(st.integers(1, 300), st.sampled_from(sorted(ring.DTYPES)), st.sampled_from(["sum", "avg"]))


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(world_size=st.integers(2, 8), cases=st.lists(CASE.map(list), min_size=1, max_size=4),
       seed=st.integers(0, 2**20))
def test_the_solution_equals_dist_all_reduce_on_drawn_inputs(world_size, cases, seed):
    cases = [*cases, [3 * world_size + 1, "float32", "sum"]]  # the steps check needs one case without empty chunks
    lab = dataclasses.replace(ring.LAB, runs=({"world_size": world_size, "seed": seed, "cases": cases},))
    result = run_lab(lab, SOLUTION)
    assert result.passed, render.lab_feedback(result)


def test_the_solution_runs_under_torchrun():
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          SOLUTION], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ring_allreduce on 2 ranks: [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0, 27.0]" in run.stdout


def _messages(*sent_and_received):
    """Calls of one rank: ("isend", peer) or ("recv", peer) in order (a call as the comm log records it)."""
    return [SimpleNamespace(name=name, peer=peer, nbytes=4) for name, peer in sent_and_received]


def test_a_ring_may_run_either_way_round_but_the_same_way_at_every_step():
    clockwise = _messages(("isend", 1), ("recv", 3), ("isend", 1), ("recv", 3))
    counter = _messages(("isend", 3), ("recv", 1), ("isend", 3), ("recv", 1))
    assert ring._neighbours_finding("case", 0, 4, clockwise).passed
    assert ring._neighbours_finding("case", 0, 4, counter).passed
    assert ring._neighbours_finding("case", 0, 4, _messages(("recv", 1), ("isend", 3))).passed
    mixed = ring._neighbours_finding("case", 0, 4, _messages(("isend", 3), ("recv", 1), ("isend", 1)))
    assert not mixed.passed and "rank 0's message 3 was sent to rank 1; in a ring rank 0 sends only to its left " \
        "neighbour, rank 3, and receives only from its right one, rank 1" in mixed.message
    owner = ring._neighbours_finding("case", 0, 4, _messages(("recv", 2)))
    assert not owner.passed and "sends only to its right neighbour, rank 1" in owner.message
