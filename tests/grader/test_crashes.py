"""grader.crashes: the first failing rank's own error is named and shown, not a peer's lost connection.

The records below are what the launcher and the probes recorded in real runs of tests/submissions/
crash_on_rank_2.py and only_rank0_trains.py (paths and ports shortened); the full runs are in
test_grader_submissions.py.
"""

import json

import pytest

from grader import render, runner
from grader.crashes import MAX_TRACEBACK_LINES, first_failure, trimmed_traceback
from grader.evidence import RunRecords
from grader.inrank.records import parse
from grader.results import Results
from grader.sandbox import SandboxResult

pytestmark = pytest.mark.unit6
WARNING = "[W1124 06:12:26.326470272 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved.\n"
HARNESS = """Traceback (most recent call last):
  File "/work/course/grader/inrank/harness.py", line 52, in main
    runpy.run_path(script, run_name="__main__")
  File "<frozen runpy>", line 291, in run_path
  File "<frozen runpy>", line 98, in _run_module_code
  File "<frozen runpy>", line 88, in _run_code
  File "/tmp/grade-14c5z42c/run/train_4gpu.py", line 67, in <module>
    main()
"""
RAISED = HARNESS + """  File "/tmp/grade-14c5z42c/run/train_4gpu.py", line 30, in main
    raise RuntimeError("deliberate failure on rank 2")
RuntimeError: deliberate failure on rank 2
"""
LOST = HARNESS + """  File "/tmp/grade-14c5z42c/run/train_4gpu.py", line 38, in main
    ddp_model = DDP(model, device_ids=[rank.device] if rank.device.type == "cuda" else None)
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/course/.venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1064, in __init__
    _verify_param_shape_across_processes(self.process_group, parameters)
RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection {how} by peer \
[127.0.0.1]:39839. This is typically caused by a remote worker crashing. Check the logs of the remote worker.
"""


def exit_record(rank, returncode, exit_s, order, stderr=""):
    return {"kind": "rank_exit", "rank": rank, "returncode": returncode, "stopped": None, "order": order,
            "exit_s": exit_s, "stdout": "", "stdout_bytes": 0, "stderr": stderr, "stderr_bytes": len(stderr)}


def evidence(exits, ends=None) -> RunRecords:
    """The records of a run: the launcher's ``exits``, the harness's ``ends`` by rank, as the grader parses them."""
    return RunRecords(world_size=4, exits={r["rank"]: parse(r) for r in exits},
                      ends={r: [parse({"rank": r, "digests": None, **e}) for e in es]
                            for r, es in (ends or {}).items()})


def rank_2_raises(rank_0_first: bool) -> RunRecords:
    """Rank 2 raises; its peers fail on the closed connection. The launcher saw rank 0 end in the same
    polling period as rank 2 (listed first) or, with ``rank_0_first``, even a millisecond earlier."""
    lost = {r: WARNING + LOST.format(how="reset" if r else "closed") for r in (0, 1, 3)}
    rank_0 = 1.201 if rank_0_first else 1.213
    exits = [exit_record(0, 1, rank_0, 0, lost[0]), exit_record(1, 1, 1.25, 2, lost[1]),
             exit_record(2, 1, 1.209, 1, WARNING + RAISED), exit_record(3, 1, 1.26, 3, lost[3])]
    ends = {r: [{"kind": "end", "how": "raised", "exit_code": 1, "steps": 0, "error": LOST.format(how="reset")}]
            for r in (0, 1, 3)}
    ends[2] = [{"kind": "end", "how": "raised", "exit_code": 1, "steps": 0, "error": RAISED}]
    return evidence(exits, ends)


def graded(ev: RunRecords) -> Results:
    status, detail = runner._status(ev, SandboxResult("error", 1, "", "", 2.0, "exited with code 1"), None)
    return Results("crash.py", status, detail, output=runner._output(ev, None))


@pytest.mark.parametrize("rank_0_first", [False, True])
def test_the_rank_that_raised_is_named_with_its_own_traceback(rank_0_first):
    results = graded(rank_2_raises(rank_0_first))
    assert results.status == "crash on rank 2"
    assert 'File "train_4gpu.py", line 30, in main' in results.detail
    assert "RuntimeError: deliberate failure on rank 2" in results.detail
    assert "harness.py" not in results.detail and "runpy" not in results.detail and "/tmp/" not in results.detail
    assert "--- rank 2 errors" in results.output and "Connection" not in results.output


def test_the_traceback_reaches_the_student_on_gradescope_and_in_the_self_check():
    results = graded(rank_2_raises(True))
    shown = json.loads(json.dumps(render.gradescope(results)))
    assert "deliberate failure on rank 2" in shown["output"] and 'File "train_4gpu.py", line 30' in shown["output"]
    assert "Connection reset" not in shown["output"] and shown["visibility"] == "visible"
    text = render.feedback(results, visible_only=True)
    assert 'raise RuntimeError("deliberate failure on rank 2")' in text and "Connection" not in text


def test_ranks_that_left_early_are_the_cause_when_rank_0_only_lost_them():
    exits = [exit_record(0, 1, 2.4, 3, WARNING + LOST.format(how="closed")),
             *(exit_record(r, 0, 2.1 + r / 100, r - 1) for r in (1, 2, 3))]
    ends = {0: [{"kind": "end", "how": "raised", "exit_code": 1, "steps": 0, "error": LOST.format(how="closed")}],
            **{r: [{"kind": "end", "how": "returned", "exit_code": 0, "steps": 0, "error": None}] for r in (1, 2, 3)}}
    results = graded(evidence(exits, ends))
    assert results.status == "early exit on rank 1, 2, 3"
    assert "1, 2, 3 took no optimizer step and exited early" in results.detail
    assert "Connection closed by peer" in results.detail and "crash on rank 0" not in results.detail


def test_a_rank_killed_by_a_signal_is_the_cause_not_its_peers():
    lost = WARNING + LOST.format(how="reset")
    exits = [exit_record(0, 1, 3.0, 0, lost), exit_record(1, -11, 3.1, 1), exit_record(2, 1, 3.0, 2, lost),
             exit_record(3, 1, 3.0, 3, lost)]
    failure = first_failure(evidence(exits), [0, 1, 2, 3])
    assert failure.status == "crash on rank 1" and "killed by signal SIGSEGV" in failure.detail


def test_with_only_lost_connections_the_first_to_end_is_named_and_the_doubt_said():
    exits = [exit_record(r, 1, 3.0 - r / 10, r, LOST.format(how="reset")) for r in range(4)]
    failure = first_failure(evidence(exits), [0, 1, 2, 3])
    assert failure.status == "crash on rank 3" and "no rank reported an error of its own" in failure.detail


def test_a_long_traceback_keeps_its_end_and_the_students_frames():
    frames = "".join(f'  File "/tmp/grade-x/run/train_4gpu.py", line {i}, in f{i}\n    f{i + 1}()\n'
                     for i in range(100))
    text = trimmed_traceback("noise\n" + HARNESS + frames + "ValueError: the last frame's error\n")
    lines = text.splitlines()
    assert lines[0].startswith("Traceback") and lines[-1] == "ValueError: the last frame's error"
    assert len(lines) <= MAX_TRACEBACK_LINES and 'File "train_4gpu.py", line 99, in f99' in text
    assert "noise" not in text and "harness" not in text


def test_output_without_a_traceback_keeps_its_last_lines():
    assert trimmed_traceback("\n".join(f"line {i}" for i in range(20))).splitlines() == [
        f"line {i}" for i in range(12, 20)]


def test_the_probes_frames_around_the_students_data_loading_are_hidden():
    """An error in the student's dataset surfaces through the probes' loader wrapper (grader/inrank/probed_data.py)."""
    text = trimmed_traceback(HARNESS + """  File "/tmp/grade-x/run/train_4gpu.py", line 40, in main
    for images, labels in train_loader:
  File "/work/course/grader/inrank/probed_data.py", line 63, in record_batches
    for item in original(loader):
  File "/work/course/.venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 701, in __next__
    data = self._next_data()
IndexError: index 5000 is out of bounds for dimension 0 with size 1197
""")
    assert "probed_data" not in text and "record_batches" not in text and "for item in original" not in text
    assert 'File "train_4gpu.py", line 40, in main' in text and text.endswith("with size 1197")


DISAGREED = """Traceback (most recent call last):
  File "/work/course/grader/inrank/harness.py", line 77, in run_script
    observed.settle()  # collectives that differ after the last sampled agreement check fail here
  File "/work/course/course/runtime/observed.py", line 322, in settle
    nccl_rules.settle([group for group in _INNER_TO_OUTER.values() if group in c10d._world.pg_map])
  File "/work/course/course/runtime/nccl_rules.py", line 212, in settle
    rules.agree()
  File "/work/course/course/runtime/nccl_rules.py", line 170, in agree
    raise self._disagreement(rank, other)
course.runtime.message_headers.NcclRuleError: NCCL rule 'agreement': collective number 5 on this process group \
differs between ranks: rank 1 issued all_reduce float32[2, 2] (at /tmp/grade-x/run/train_4gpu.py:6), but rank 0 \
issued all_reduce float32[4] (at /tmp/grade-x/run/train_4gpu.py:6). On GPUs NCCL would hang or mix up the data. \
Fix: every rank must call the same collectives in the same order, with the same shapes, dtypes and root.
"""


def test_a_rule_broken_at_the_end_fails_one_rank_and_says_the_others_ended_well():
    """What the harness recorded when a script's collective number 5 differed and the script then returned (the
    ranks compare at their 1st, 2nd and 4th collective, and once more at the end: tests/grader/inrank/test_harness.py):
    the rank that reached the end last names the difference; the others end with code 0."""
    exits = [exit_record(r, 1 if r == 1 else 0, 2.0 + r / 100, r, DISAGREED if r == 1 else "") for r in range(4)]
    ends = {r: [{"kind": "end", "how": "raised" if r == 1 else "returned", "exit_code": int(r == 1), "steps": 0,
                 "error": DISAGREED if r == 1 else None}] for r in range(4)}
    results = graded(evidence(exits, ends))
    assert results.status == "crash on rank 1"
    assert results.detail.startswith("rank 1 failed, with the error below; the other ranks ended without an error.")
    assert "NCCL rule 'agreement': collective number 5" in results.detail and "harness" not in results.detail
