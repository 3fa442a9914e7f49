"""Lab (notebook 09b): the student reads a profiler trace and says how much communication hid behind backward.

The student's ``overlap_fraction(trace, pid)`` gets a Chrome trace (``{"traceEvents": [...]}``) and a process id,
and returns the share of that process's communication time (the union of its ``gloo:``/``nccl:`` events) that
fell between the start of ``backward`` and the end of the last gradient. :func:`check_on_rank` first records a real
trace: every rank profiles one DDP step (:func:`course.practice.profiling.profile_ddp_step`) and the ranks' traces
are merged into one, as a multi-rank trace viewer shows them. Rank 0 then checks the student's reader on synthetic
traces made from the run's seed (each kind isolates one thing a reader must get right), and every rank checks it on
the merged real trace for its own process. The answer is computed here (:func:`expected`), the likely mistakes too
(:data:`MISTAKES`), so that a wrong number is named ("you summed the durations: ..."). A file using the
course's own reader is refused (the lab's ``shortcuts``).

Checks: one process, communication in and after backward; overlapping communication counted once (union); none
counted during forward; only the given process; the real 2-rank DDP trace.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from course.practice.profiling import Setup, profile_ddp_step
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry

CHECKS = (
    Check("one_rank", "the fraction on synthetic traces of one process", 3),
    Check("union", "communication on two threads at once counts once (the union of intervals)", 2),
    Check("forward", "communication during forward does not count as overlapped", 2),
    Check("per_rank", "only the given process's events count (a trace with two ranks)", 2),
    Check("real_trace", "the fraction on a real 2-rank DDP trace recorded by the checker", 2),
)
COMMUNICATION = ("gloo:", "nccl:")
LAST_GRADIENT = "torch::autograd::AccumulateGrad"
TOLERANCE = 1e-6
TRACES_PER_CHECK = 4


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _fraction(trace: dict, pid: int | None, union: bool = True, window_from: str = "backward") -> float:
    """The overlap as the lab defines it (defaults), or as a mistake computes it: ``pid=None`` reads every
    process, ``union=False`` sums durations, ``window_from="forward"`` counts overlap with forward too."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and (pid is None or e.get("pid") == pid)]
    start = min(e["ts"] for e in events if e["name"] == window_from)
    end = max(e["ts"] + e["dur"] for e in events if e["name"] == LAST_GRADIENT)
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith(COMMUNICATION)]
    comm = _union(comm) if union else comm
    total = sum(b - a for a, b in comm)
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in comm) / total if total > 0 else 0.0


def expected(trace: dict, pid: int) -> float:
    """The share of ``pid``'s communication time (union) inside its backward window (0 to 1)."""
    return _fraction(trace, pid)


#: what a reader with each likely mistake returns, and how the message names it
MISTAKES: dict[str, tuple[Callable[[dict, int], float], str]] = {
    "summed": (lambda t, p: _fraction(t, p, union=False),
               "it equals the durations summed: two communication events that overlap in time were counted twice; "
               "merge the intervals first (their union)"),
    "forward": (lambda t, p: _fraction(t, p, window_from="forward"),
                "it counts the communication during forward as overlapped: the window starts at \"backward\""),
    "every_pid": (lambda t, p: _fraction(t, None),
                  "it is the answer over every process in the trace: keep the events whose \"pid\" is the one asked"),
    "backward_end": (lambda t, p: _fraction_to_backward_end(t, p),
                     "it runs the window to the end of the \"backward\" range; backward's compute ends with the "
                     f"last {LAST_GRADIENT} (DDP then waits in the range for its last all-reduce)"),
}


def _fraction_to_backward_end(trace: dict, pid: int) -> float:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == pid]
    backward = next(e for e in events if e["name"] == "backward")
    shifted = [e for e in trace["traceEvents"] if e.get("name") != LAST_GRADIENT or e.get("pid") != pid]
    shifted.append({"ph": "X", "pid": pid, "tid": 0, "name": LAST_GRADIENT, "ts": backward["ts"],
                    "dur": backward["dur"]})
    return _fraction({"traceEvents": shifted}, pid)


def synthetic(kind: str, seed: int) -> tuple[dict, list[int]]:
    """A made-up trace of ``kind`` ("one_rank", "union", "forward", "per_rank") and the pids to ask about.

    Each kind adds one difficulty to "one_rank" (one process; communication on one thread, in backward, after the
    last gradient and after the step): "union" a second communication thread overlapping the first, "forward"
    communication during forward, "per_rank" a second process with its own timings.
    """
    rng = random.Random(f"{kind}-{seed}")
    pids = [rng.randrange(1000, 60000)]
    if kind == "per_rank":
        pids.append(pids[0] + rng.randrange(1, 500))
    events: list[dict] = []
    for pid in pids:
        events += [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {len(events)}"}},
                   {"ph": "i", "pid": pid, "tid": 1, "name": "step", "ts": 0.0, "s": "t"}]
        forward, backward = rng.uniform(200, 400), rng.uniform(400, 800)
        done = forward + backward * rng.uniform(0.6, 0.85)  # then DDP waits inside "backward"
        events += [_event(pid, 1, "forward", 0.0, forward), _event(pid, 1, "backward", forward, backward),
                   _event(pid, 1, "optimizer", forward + backward, 50.0)]
        for _ in range(rng.randrange(3, 7)):
            ts = rng.uniform(forward, done - 5)
            events.append(_event(pid, 1, LAST_GRADIENT, ts, min(5.0, done - ts)))
        events.append(_event(pid, 1, LAST_GRADIENT, done - 5, 5.0))
        ts = forward + rng.uniform(10, 60)
        while ts < forward + backward + 100:  # one thread: one all-reduce after the other
            dur = rng.uniform(20, 90)
            events.append(_event(pid, 2, "gloo:all_reduce", ts, dur))
            ts += dur + rng.uniform(5, 40)
        if kind == "union":
            for _ in range(3):
                ts = rng.uniform(forward, forward + backward)
                events.append(_event(pid, 3, "gloo:all_gather", ts, rng.uniform(30, 120)))
        if kind == "forward":
            ts = rng.uniform(10, forward / 2)
            events.append(_event(pid, 2, "gloo:all_gather", ts, rng.uniform(20, forward / 2 - 10)))
    rng.shuffle(events)  # a trace's events come in no promised order
    return {"traceEvents": events}, pids


def _event(pid: int, tid: int, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": round(ts, 3), "dur": round(dur, 3)}


def _judge(check: str, reader: Callable[[dict, int], object], trace: dict, pid: int, what: str) -> Finding:
    got = reader(json.loads(json.dumps(trace)), pid)  # a copy: a reader that edits the trace spoils nothing
    want = expected(trace, pid)
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return Finding(check, False, f"on {what}, your overlap_fraction returned {got!r}; expected a float "
                       f"from 0 to 1 ({want:.4f} here)")
    if abs(got - want) <= TOLERANCE:
        return Finding(check, True)
    named = next((text for fn, text in MISTAKES.values() if abs(fn(trace, pid) - want) > TOLERANCE
                  and abs(fn(trace, pid) - got) <= TOLERANCE), "")
    return Finding(check, False, f"on {what}, your overlap_fraction returned {got:.4f} for pid {pid}, expected "
                   f"{want:.4f}" + (f": {named}" if named else ""))


def _synthetic_findings(reader: Callable[[dict, int], object], seed: int) -> list[Finding]:
    found = []
    for kind in ("one_rank", "union", "forward", "per_rank"):
        finding = Finding(kind, True)
        for index in range(TRACES_PER_CHECK):
            trace, pids = synthetic(kind, seed * 100 + index)
            for pid in pids:
                finding = _judge(kind, reader, trace, pid, f"synthetic trace {index} ({kind}, seed {seed})")
                if not finding.passed:
                    break
            if not finding.passed:
                break
        found.append(finding)
    return found


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: record this rank's trace of one DDP step, merge the ranks' traces, check the reader."""
    rank = dist.get_rank()
    with tempfile.TemporaryDirectory(prefix="course-trace-") as trace_dir:
        recorded = profile_ddp_step(trace_dir, Setup(width=128, depth=4, batch_size=32, bucket_cap_mb=0.07))
        mine = json.loads(Path(recorded["trace"]).read_text())
    everyone: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    pids = [next(e["pid"] for e in trace["traceEvents"] if e.get("name") == "backward") for trace in everyone]
    merged = {"traceEvents": [e for trace in everyone for e in trace["traceEvents"]]}
    reader = load_entry(path, "overlap_fraction")
    found = _synthetic_findings(reader, config["seed"]) if rank == 0 else []
    found.append(_judge("real_trace", reader, merged, pids[rank], f"the real trace of {len(pids)} ranks "
                        f"(rank {rank}'s process)"))
    return RankFindings(found)


def _run(seed: int | str, label: str) -> dict:
    return {"world_size": 2, "seed": seed, "label": label, "timeout_s": 60.0}


LAB = Lab(
    name="trace_overlap",
    title="communication hidden behind backward, read from a profiler trace",
    notebook="09b_profiling_and_pitfalls",
    student_file="labs/trace_overlap.py",
    entry="overlap_fraction",
    checks=CHECKS,
    rank_check=check_on_rank,
    runs=(_run(0, "synthetic traces of seed {seed} and a real DDP step"),),
    variant={"seed": tuple(range(1000))},  # each student's own traces (grader.labs.variant): no fraction to paste
    hidden_runs=(_run("jitter", "synthetic traces of a new seed and a real DDP step"),),
    shortcuts=tuple(f"course.practice.profiling:{name}" for name in ("overlap_fraction", "read_trace", "_inside")),
    hang_hint="Your overlap_fraction runs on one process and calls no collective: a loop that never ends is the "
              "likely cause.",
)

__all__ = ["LAB", "MISTAKES", "check_on_rank", "expected", "synthetic"]
