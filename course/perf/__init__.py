"""The performance model of data-parallel training on real GPUs: the model, the hardware catalog, the
workloads it is checked on, and the published figures it is checked against."""
