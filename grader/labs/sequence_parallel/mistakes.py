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
    "sums_bias_grad": Mistake(
        why="backward sums the bias gradient over the ranks too, though each rank's rows of the bias are its own.",
        edits=(
            (('from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older\n'
             '\n'),
             'from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older\n'),
            (('        return grad_x, grad_weight, grad.sum(dim=(0, 1))\n'
             '\n'
             '\n'
             'if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/sequence_parallel.py\n'
             '    from course import world\n'
             '\n'
             '    me = world.init_from_env()\n'
             '    torch.manual_seed(0)\n'
             '    x, weight, bias = torch.randn(2, 8, 16), torch.randn(32, 16), torch.randn(32)\n'
             '    k, s = 32 // me.world_size, 8 // me.world_size\n'
             '    rank = dist.get_rank()\n'
             '    rows, positions = slice(rank * k, (rank + 1) * k), slice(rank * s, (rank + 1) * s)\n'
             '    mine = GatherLinear.apply(x[:, positions].to(me.device), weight[rows].to(me.device), bias[rows].to(me.device))\n'
             '    error = (mine.cpu() - F.linear(x, weight, bias)[..., rows]).abs().max().item()\n'
             '    world.print0(f"GatherLinear on {me.world_size} ranks differs from the unsplit linear by {error:.2e}")\n'
             '    world.shutdown()\n'),
             ('        grad_bias = grad.sum(dim=(0, 1)).contiguous()\n'
             "        dist.all_reduce(grad_bias)  # wrong: every rank's rows of the bias are its own, already whole\n"
             '        return grad_x, grad_weight, grad_bias\n')),
        ),
    ),
}
