def send_chunk(rank, step, world_size):
    """The chunk `rank` sends to its right neighbour at `step`: its own at step 0, then what it last received."""
    return (rank - step) % world_size
