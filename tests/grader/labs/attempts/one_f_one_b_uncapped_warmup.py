"""Wrong attempt (one_f_one_b): p-stage-1 warm-up forwards even when there are fewer micro-batches than that."""


def one_f_one_b(num_stages: int, num_micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The order in which `stage` runs the forwards ("F", i) and backwards ("B", i) of micro-batches 0..m-1."""
    warmup = num_stages - stage - 1  # no min(..., num_micro_batches): right only while m >= p - 1
    schedule = [("F", i) for i in range(warmup)]
    for i in range(warmup, num_micro_batches):
        schedule += [("F", i), ("B", i - warmup)]
    return schedule + [("B", i) for i in range(num_micro_batches - warmup, num_micro_batches)]
