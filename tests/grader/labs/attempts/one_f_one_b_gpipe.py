"""Wrong attempt (one_f_one_b): GPipe's order: every forward, then every backward."""


def one_f_one_b(num_stages: int, num_micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The order in which `stage` runs the forwards ("F", i) and backwards ("B", i) of micro-batches 0..m-1.

    1F1B: first some warm-up forwards (how many, so that the last stage can start its first backward as soon
    as possible?), then one forward and one backward in turn, then the remaining backwards. Micro-batches go
    forward in order 0, 1, 2, ... and backward in the same order. A stage holds a micro-batch's activations from
    its forward to its backward: never hold more than num_stages of them.
    """
    return [("F", i) for i in range(num_micro_batches)] + [("B", i) for i in range(num_micro_batches)]


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/one_f_one_b.py
    from course import world
    from course.model_parallel import pipeline, schedules, transformer

    me = world.init_from_env()
    config = transformer.Config(num_layers=me.world_size)
    ops = [schedules.Op(kind, i) for kind, i in one_f_one_b(me.world_size, 8, me.rank)]
    inputs, targets = transformer.sample_batch(config, batch_size=8)
    record = pipeline.run(pipeline.split(transformer.build(config), me.world_size)[me.rank], ops, inputs, targets, 8)
    print(f"stage {me.rank}: {' '.join(record.ops)}; at most {max(record.in_flight)} micro-batches held")
    world.shutdown()
