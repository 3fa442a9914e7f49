"""Lab: how much communication hid behind backward, read from a profiler trace (notebook 09b).
Check: course.labs.check("trace_overlap")."""

STUDENT_ID = ""  # your student id (the one you log in with): the check draws your own variant from it

COMMUNICATION = ("gloo:", "nccl:")  # the names of the backends' communication events start with these
LAST_GRADIENT = "torch::autograd::AccumulateGrad"  # one event per gradient written into a parameter's .grad


def overlap_fraction(trace: dict, pid: int) -> float:
    """The fraction of process `pid`'s communication time that ran while its backward was still computing.

    trace is a torch.profiler Chrome trace, as json.load reads it: {"traceEvents": [event, ...]}. Only complete
    events count: "ph" == "X", each with "name", "pid", "tid", "ts" (its start, in microseconds) and "dur" (its
    length). A trace may hold several processes (one per rank): use the events of `pid` only.

    * Communication: the events whose name starts with one of COMMUNICATION. Two of them may overlap in time
      (different threads): their shared time counts once. Take the union of their intervals.
    * Backward compute: from the start of the event named "backward" to the end of the last LAST_GRADIENT event.
      (The "backward" range itself ends later: DDP waits there for its last all-reduce.)

    Returns the length of (communication union) inside the backward window, divided by the length of the
    communication union: a number from 0 to 1; 0.0 when `pid` has no communication.
    """
    raise NotImplementedError("select pid's events, merge the communication intervals, measure them in the window")


if __name__ == "__main__":  # python labs/trace_overlap.py: a made-up trace of one process
    events = [{"ph": "X", "pid": 1, "tid": 1, "name": "forward", "ts": 0, "dur": 100},
              {"ph": "X", "pid": 1, "tid": 1, "name": "backward", "ts": 100, "dur": 300},
              {"ph": "X", "pid": 1, "tid": 1, "name": LAST_GRADIENT, "ts": 290, "dur": 10},
              {"ph": "X", "pid": 1, "tid": 2, "name": "gloo:all_reduce", "ts": 200, "dur": 200},
              {"ph": "X", "pid": 1, "tid": 3, "name": "gloo:all_reduce", "ts": 250, "dur": 50}]
    print(f"overlap {overlap_fraction({'traceEvents': events}, pid=1):.2f} (expected 0.50)")
