"""Wrong: it hands the work to the course's own pipeline runner."""

from course.model_parallel import pipeline


def run_stage(stage, ops, micro_inputs, loss_fn, activation_shape):
    return pipeline.run(stage, ops, micro_inputs, micro_inputs, len(micro_inputs))
