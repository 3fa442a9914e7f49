"""Lab: estimate a plan by hand (notebook 05c). Check: course.labs.check("estimate", "labs/estimate_plan.py").

The check calls your two functions with your own numbers, drawn from STUDENT_ID (a layer count, a hidden size,
t, d, a link), and compares them with course.perf. Work from the formulas of notebooks 05c and 07; importing
course.perf or course.memory is refused.
"""

STUDENT_ID = ""  # your student id (the one you log in with): your numbers are drawn from it


def model_states_bytes(params: float, tensor_parallel: int, data_parallel: int, zero_stage: int) -> float:
    """Bytes of parameters, gradients and optimizer state that one GPU holds under mixed-precision Adam.

    Per parameter: a 16-bit parameter (2 bytes), a 16-bit gradient (2), and in the optimizer an fp32 master
    copy, momentum and variance (4 + 4 + 4). Tensor parallelism gives each GPU 1/tensor_parallel of every layer.
    ZeRO then shards over the data_parallel GPUs: stage 1 the optimizer state, stage 2 also the gradients,
    stage 3 also the parameters; stage 0 (DDP) shards nothing.
    """
    raise NotImplementedError("bytes per parameter, then what each ZeRO stage divides by data_parallel")


def tp_allreduce_seconds(seq_len: int, micro_batch: int, hidden: int, tensor_parallel: int, alpha_s: float,
                         bytes_per_s: float) -> float:
    """Seconds one transformer layer's forward spends in its tensor-parallel all-reduces, on one node.

    A layer's forward all-reduces its 16-bit activations (seq_len x micro_batch x hidden values) twice: after
    attention and after the MLP. Each is a ring over tensor_parallel GPUs. Each message costs alpha_s (latency)
    plus its bytes / bytes_per_s. How many steps does a ring all-reduce take, and how many bytes does each GPU send?
    """
    raise NotImplementedError("two ring all-reduces: latency terms plus bytes terms")


if __name__ == "__main__":  # python labs/estimate_plan.py: your answers for a 1.3 B model on 8 GPUs of one node
    print(f"{model_states_bytes(1.3e9, 2, 4, 1) / 1e9:.2f} GB of model states per GPU at ZeRO-1, t=2, d=4")
    print(f"{tp_allreduce_seconds(2048, 4, 2048, 2, 5e-6, 200e9) * 1e3:.3f} ms of TP all-reduce per layer forward")
