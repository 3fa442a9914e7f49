"""Lab: the 1F1B pipeline schedule and its interleaved variant (notebook 08). Check: course.labs.check("one_f_one_b").

A schedule says, for one stage (one rank) of a pipeline of num_stages stages, in which order it runs the forward
("F") and backward ("B") of each micro-batch 0 .. num_micro_batches-1. The check asks your functions for every
stage, simulates the stages together (a forward takes 1 time unit, a backward 2), and runs 1F1B for real.
You also write that simulation, idle_fraction: it finds your schedule's bubble, or its deadlock.
"""

STUDENT_ID = "solution"  # your student id (the one you log in with): the check draws your own variant from it


def one_f_one_b(num_stages: int, num_micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The order in which `stage` runs the forwards ("F", i) and backwards ("B", i) of micro-batches 0..m-1.

    A forward of micro-batch i on stage s needs stage s-1's forward of i; a backward needs stage s+1's backward
    of i. Micro-batches go forward in order 0, 1, 2, ... and backward in the same order. 1F1B has three phases:

    1. warm-up: forwards only. How many, so that stage s is never idle while stage s+1 can still send it a
       backward, yet holds as few micro-batches as possible? Mind num_micro_batches < num_stages.
    2. steady: one forward, then one backward, in turn.
    3. cool-down: the backwards that are left.

    A stage holds a micro-batch's activations from its forward to its backward: 1F1B holds at most
    num_stages - stage of them (GPipe, every forward first, holds all num_micro_batches).
    """
    forwards = [("F", i) for i in range(num_micro_batches)]
    backwards = [("B", i) for i in range(num_micro_batches)]
    return phases(forwards, backwards, warmup=num_stages - stage - 1)


def idle_fraction(plans: list[list[tuple[str, int]]], forward_s: float = 1.0, backward_s: float = 2.0) -> float:
    """Simulate the stages running `plans` together; return the share of the step each stage sits idle (the bubble).

    plans[s] is stage s's order, as one_f_one_b(p, m, s) returns it. A forward takes forward_s, a backward
    backward_s; sending is free. An op starts once its stage has finished its previous op and what it needs has
    arrived: forward i on stage s needs forward i of stage s-1, backward i needs backward i of stage s+1.

    Go round the stages, running each one's next op whenever it can, until every op has run. A round that runs
    nothing means every stage waits for another: raise ValueError (a deadlock). Then the idle share is
    1 - (time all stages were busy) / (p x the step's time).
    """
    p = len(plans)
    finished = {}  # (kind, stage, micro_batch) -> when it ended
    position, free, busy = [0] * p, [0.0] * p, 0.0  # each stage's next op and when it is free
    while any(position[s] < len(plans[s]) for s in range(p)):
        ran = False
        for s in range(p):
            if position[s] == len(plans[s]):
                continue
            kind, i = plans[s][position[s]]
            needs = (kind, s - 1 if kind == "F" else s + 1, i)  # from the neighbour it receives from
            if 0 <= needs[1] < p and needs not in finished:
                continue
            seconds = forward_s if kind == "F" else backward_s
            free[s] = finished[(kind, s, i)] = max(free[s], finished.get(needs, 0.0)) + seconds
            busy += seconds
            position[s], ran = position[s] + 1, True
        if not ran:
            raise ValueError(f"deadlock: every stage waits; the stages are at ops {position}")
    return 1 - busy / (p * max(free))


def interleaved(num_stages: int, num_micro_batches: int, stage: int, chunks: int) -> list[tuple[str, int, int]]:
    """Interleaved 1F1B: the order of ("F", i, c) and ("B", i, c) ops of micro-batch i on model chunk c of `stage`.

    Each rank holds `chunks` (v) model chunks: chunk c of rank s is virtual stage c * num_stages + s, so a
    micro-batch goes through ranks 0, 1, ..., p-1 on chunk 0, then again on chunk 1, and so on; backward visits
    the virtual stages in reverse (the last chunk first). Each op takes 1/v of a whole stage's time, so the
    pipeline fills and drains v times faster: the bubble shrinks to (p-1)/(v*m+p-1).

    num_micro_batches is a multiple of num_stages. Send the micro-batches in groups of num_stages: each group
    goes forward through chunk 0, then chunk 1, ...; backward goes through the chunks in reverse. Then, as in
    1F1B, warm up with forwards, alternate one forward and one backward, and finish the backwards. The warm-up
    is longer than 1F1B's: the first backward needs micro-batch 0 through every chunk first.
    """
    p = num_stages
    forwards, backwards = [], []
    for group in range(0, num_micro_batches, p):  # micro-batches group, ..., group + p - 1
        for chunk in range(chunks):
            forwards += [("F", i, chunk) for i in range(group, group + p)]
            backwards += [("B", i, chunks - 1 - chunk) for i in range(group, group + p)]
    # micro-batch 0 must pass chunks 0 .. v-2 on every rank ((v-1)·p ops here) and reach the last rank on chunk
    # v-1 before its first backward can come back; a second p-s-1 lets the steady phase wait for nothing
    warmup = (chunks - 1) * p + 2 * (p - stage - 1)
    return phases(forwards, backwards, warmup)


def phases(forwards: list, backwards: list, warmup: int) -> list:
    """warmup forwards (at most all of them), then one forward one backward in turn, then the backwards left."""
    warmup = min(warmup, len(forwards))
    schedule = forwards[:warmup]
    for forward, backward in zip(forwards[warmup:], backwards, strict=False):
        schedule += [forward, backward]
    return schedule + backwards[len(forwards) - warmup:]


if __name__ == "__main__":  # python labs/one_f_one_b.py: print your schedules for 4 stages and 8 micro-batches
    print(f"1F1B, 4 stages, 8 micro-batches: idle {idle_fraction([one_f_one_b(4, 8, s) for s in range(4)]):.1%}")
    for stage in range(4):
        print(f"stage {stage}, 1F1B:        ", " ".join(f"{k}{i}" for k, i in one_f_one_b(4, 8, stage)))
        print(f"stage {stage}, interleaved: ", " ".join(f"{k}{i}/{c}" for k, i, c in interleaved(4, 8, stage, 2)))
