def linear_with_warmup(step, base_lr, base_batch_size, global_batch_size, warmup_steps):
    """The learning rate at `step` (0-based): the linear scaling rule, ramped up linearly over warmup_steps."""
    peak = base_lr * global_batch_size / base_batch_size
    return peak if warmup_steps == 0 else peak * min(1.0, (step + 1) / warmup_steps)
