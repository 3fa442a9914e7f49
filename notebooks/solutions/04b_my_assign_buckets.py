def my_assign_buckets(grad_bytes, bucket_bytes):
    """Indices of the gradients in each bucket, in order; a new bucket when the next tensor would overflow."""
    buckets, filled = [], 0
    for index, size in enumerate(grad_bytes):
        if not buckets or filled + size > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += size
    return buckets
