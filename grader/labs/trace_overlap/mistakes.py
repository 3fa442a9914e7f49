"""The trace_overlap lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_trace_overlap*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "counts_forward": Mistake(
        why="it counts communication overlapped with any compute, forward included",
        edits=(
            ('    start = min(e["ts"] for e in events if e["name"] == "backward")\n',
             '    start = min(e["ts"] for e in events if e["name"] == "forward")\n'),
        ),
    ),
    "ignores_pid": Mistake(
        why="it reads every process's events, whatever the pid asked",
        edits=(
            ('    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == pid]\n',
             '    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]\n'),
        ),
    ),
    "sums_durations": Mistake(
        why="it adds up the communication events' durations instead of taking the union of their intervals",
        edits=(
            ("    merged = []  # [start, end] of the communication union, sorted\n"
             '    for ts, te in sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith(COMMUNICATION)):\n'
             "        if merged and ts <= merged[-1][1]:\n"
             "            merged[-1][1] = max(merged[-1][1], te)\n"
             "        else:\n"
             "            merged.append([ts, te])\n",
             '    merged = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith(COMMUNICATION)]\n'),
        ),
    ),
    "reads_cpu_ranges": Mistake(
        why="it takes NCCL's CPU ranges (nccl:all_reduce, the enqueue of a kernel) for the communication",
        edits=(
            ('COMMUNICATION = ("gloo:", "ncclDevKernel_", "ncclKernel_")\n',
             'COMMUNICATION = ("gloo:", "nccl:")\n'),
        ),
    ),
}
