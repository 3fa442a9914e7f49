"""The sequence_parallel lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_sequence_parallel*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "backward_all_reduce": Mistake(
        why="backward all-reduces the input gradient, then keeps its positions (not a reduce-scatter)",
        edits=(
            ("        grad_x = reduce_scatter_sequence(grad @ weight)  # (B, S/t, d)\n",
             "        summed = (grad @ weight).contiguous()\n"
             "        dist.all_reduce(summed)\n"
             "        s = x.shape[1]\n"
             "        grad_x = summed[:, dist.get_rank() * s:(dist.get_rank() + 1) * s]\n"),
        ),
    ),
    "identity_backward": Mistake(
        why="backward keeps this rank's term of the input gradient, never summed over the ranks",
        edits=(
            ("        grad_x = reduce_scatter_sequence(grad @ weight)  # (B, S/t, d)\n",
             "        s = x.shape[1]\n"
             "        grad_x = (grad @ weight)[:, dist.get_rank() * s:(dist.get_rank() + 1) * s]\n"),
        ),
    ),
    "wrong_dim": Mistake(
        why="the gather stacks the ranks' positions along dim 0 (the batch), not the sequence",
        edits=(
            ("    shard = x.transpose(0, 1).contiguous()  # (S/t, B, d)\n",
             "    shard = x.contiguous()\n"),
            ("    all_gather_single(whole, shard)\n"
             "    return whole.transpose(0, 1)\n",
             "    dist.all_gather_into_tensor(whole, shard)\n"
             "    return whole\n"),
            ("    reduce_scatter_single(mine, whole)\n",
             "    dist.reduce_scatter_tensor(mine, whole)\n"),
        ),
    ),
}
