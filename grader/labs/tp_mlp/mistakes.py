"""The tp_mlp lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_tp_mlp*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "bias_before_reduce": Mistake(
        why="fc2's bias is added before g, so the sum counts it world_size times",
        edits=(
            ("        return ReduceFromTensorParallel.apply(F.linear(hidden, self.w2)) + self.b2\n",
             "        return ReduceFromTensorParallel.apply(F.linear(hidden, self.w2, self.b2))\n"),
        ),
    ),
    "f_backward_identity": Mistake(
        why="f's backward forgets to sum the gradient over the ranks",
        edits=(
            ("        grad = grad.contiguous().clone()\n"
             "        dist.all_reduce(grad)\n",
             ""),
        ),
    ),
    "g_all_gather": Mistake(
        why="g sums the partial outputs with an all_gather: right numbers, the wrong collective",
        edits=(
            ("        x = x.contiguous().clone()\n"
             "        dist.all_reduce(x)\n"
             "        return x\n",
             "        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]\n"
             "        dist.all_gather(parts, x.contiguous())\n"
             "        return torch.stack(parts).sum(0)\n"),
        ),
    ),
    "g_backward_allreduce": Mistake(
        why="g's backward also sums over the ranks: gradients upstream are world_size times too large",
        edits=(
            ("        return x\n"
             "\n"
             "    @staticmethod\n"
             "    def backward(ctx, grad):\n",
             "        return x\n"
             "\n"
             "    @staticmethod\n"
             "    def backward(ctx, grad):\n"
             "        grad = grad.contiguous().clone()\n"
             "        dist.all_reduce(grad)\n"),
        ),
    ),
    "hard_coded_shard": Mistake(
        why="the shard size written for the published variant, 64 columns over 4 ranks",
        edits=(
            ("        rank, world_size = dist.get_rank(), dist.get_world_size()\n"
             "        k = fc1.out_features // world_size\n",
             "        rank = dist.get_rank()\n"
             "        k = 16  # d_ff=64 over 4 ranks, as in the published check\n"),
        ),
    ),
}
