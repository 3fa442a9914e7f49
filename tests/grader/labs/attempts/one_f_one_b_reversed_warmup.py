"""Wrong attempt (one_f_one_b): the warm-up counted from the wrong end (stage s runs s warm-up forwards)."""


def one_f_one_b(num_stages: int, num_micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """As in the lab (grader/labs/one_f_one_b/reference.py)."""
    forwards = [("F", i) for i in range(num_micro_batches)]
    backwards = [("B", i) for i in range(num_micro_batches)]
    return phases(forwards, backwards, warmup=stage)


def idle_fraction(plans: list[list[tuple[str, int]]], forward_s: float = 1.0, backward_s: float = 2.0) -> float:
    """As in the lab (grader/labs/one_f_one_b/reference.py)."""
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
    """As in the lab (grader/labs/one_f_one_b/reference.py)."""
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
    """As in the lab (grader/labs/one_f_one_b/reference.py)."""
    warmup = min(warmup, len(forwards))
    schedule = forwards[:warmup]
    for forward, backward in zip(forwards[warmup:], backwards, strict=False):
        schedule += [forward, backward]
    return schedule + backwards[len(forwards) - warmup:]

