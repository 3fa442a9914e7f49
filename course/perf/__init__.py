"""The performance model of training on real GPUs: data parallelism step by step (model), tensor, context, pipeline
and sharded data parallelism (parallel, planner), a lab's recorded bucket schedule timed on a real cluster
(schedule), the hardware catalog, the workloads it is checked on, and the published figures it is checked against."""
