"""The zero lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_zero*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "allreduce_then_shard": Mistake(
        why="allreduces the whole gradient, then keeps its shard: 1.5x DDP's traffic",
        edits=(
            ("        grad = torch.empty_like(self.exp_avg)\n"
             "        reduce_scatter_single(grad, grads)\n"
             "        grad /= self.world_size\n",
             "        dist.all_reduce(grads)\n"
             "        grad = grads[self.rank * self.shard:(self.rank + 1) * self.shard] / self.world_size\n"),
        ),
    ),
    "floor_shards": Mistake(
        why="shard boundaries: shards of numel // world_size, so the last elements are in no shard",
        edits=(
            ("        self.shard = -(-numel // self.world_size)  # ceil: the last shard is padded\n",
             "        self.shard = numel // self.world_size  # floor: the last numel % world_size elements are in no shard\n"),
            ('        """The tensors flattened into one vector padded with zeros to world_size * shard elements."""\n'
             "        flat = torch.cat([t.reshape(-1) for t in tensors])\n"
             "        return torch.nn.functional.pad(flat, (0, self.world_size * self.shard - flat.numel()))\n",
             '        """The tensors flattened into one vector, cut to world_size * shard elements."""\n'
             "        return torch.cat([t.reshape(-1) for t in tensors])[:self.world_size * self.shard]\n"),
            ("        all_gather_single(everything, mine)\n",
             "        dist.all_gather_single(everything, mine)\n"
             "        full = torch.cat([p.reshape(-1) for p in self.params])\n"
             "        full[:everything.numel()] = everything\n"),
            ("            p.copy_(everything[offset:offset + p.numel()].view_as(p))\n",
             "            p.copy_(full[offset:offset + p.numel()].view_as(p))\n"),
        ),
    ),
    "full_state": Mistake(
        why="allreduces the gradients and steps the full Adam state on every rank",
        edits=(
            ("        self.shard = -(-numel // self.world_size)  # ceil: the last shard is padded\n",
             "        self.shard = numel  # every rank keeps the state of every parameter\n"),
            ("        return torch.nn.functional.pad(flat, (0, self.world_size * self.shard - flat.numel()))\n",
             "        return flat\n"),
            ("        grad = torch.empty_like(self.exp_avg)\n"
             "        reduce_scatter_single(grad, grads)\n"
             "        grad /= self.world_size\n"
             "        mine = self._flat(self.params)[self.rank * self.shard:(self.rank + 1) * self.shard]\n",
             "        dist.all_reduce(grads)\n"
             "        grad = grads / self.world_size\n"
             "        mine = self._flat(self.params)\n"),
            ("        everything = torch.empty(self.world_size * self.shard, dtype=mine.dtype, device=mine.device)\n"
             "        all_gather_single(everything, mine)\n",
             "        everything = mine\n"),
        ),
    ),
    "no_all_gather": Mistake(
        why="forgets to all-gather: each rank writes back only its own shard",
        edits=(
            ("        everything = torch.empty(self.world_size * self.shard, dtype=mine.dtype, device=mine.device)\n"
             "        all_gather_single(everything, mine)\n",
             "        everything = self._flat(self.params)  # the old parameters, with this rank's shard updated\n"
             "        everything[self.rank * self.shard:(self.rank + 1) * self.shard] = mine\n"),
        ),
    ),
    "sums": Mistake(
        why="sums the gradients without averaging them",
        edits=(
            ("        reduce_scatter_single(grad, grads)\n"
             "        grad /= self.world_size\n",
             "        dist.reduce_scatter_single(grad, grads)\n"),
        ),
    ),
}
