def bubble(num_stages, num_micro_batches):
    """Idle fraction of a stage in the ideal GPipe schedule: p - 1 idle slots of the m + p - 1 the schedule takes."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)
