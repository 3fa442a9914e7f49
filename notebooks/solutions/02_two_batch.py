def two_batch(small_norm_sq, big_norm_sq, small_batch_size, big_batch_size):
    """(trace_sigma, grad_norm_sq) from E|G_B|^2 = |G|^2 + tr(Sigma) / B at B = small_batch_size and big_batch_size."""
    trace_sigma = (small_norm_sq - big_norm_sq) / (1 / small_batch_size - 1 / big_batch_size)
    return trace_sigma, big_norm_sq - trace_sigma / big_batch_size
