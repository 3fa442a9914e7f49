"""Model parallelism (notebook 03, and the tensor/pipeline unit): two_stage (a network cut into stages, one per
rank) and bubble (the idle time of a pipeline); notebook 08: transformer (with corpus), tensor_parallel,
sequence_parallel, schedules, pipeline, mesh (tensor x data parallelism) and plan (which split the performance model
picks for a cluster); parity (each strategy's loss beside one process's, bug or rounding: loss_bound,
parity_ranks)."""
