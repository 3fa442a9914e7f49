def my_shard(n, rank, world_size):
    """DistributedSampler(shuffle=False): pad by wrapping to a multiple of world_size, then every world_size-th."""
    total = -(-n // world_size) * world_size
    padded = [i % n for i in range(total)]
    return padded[rank:total:world_size]
