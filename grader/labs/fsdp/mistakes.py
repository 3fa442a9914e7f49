"""The fsdp lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_fsdp*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "waits_at_once": Mistake(
        why="each all-gather is asynchronous but waited for at once, so nothing overlaps",
        edits=(
            ("            self.prefetch(step + 1)  # the next layer's gather runs while this layer computes\n",
             ""),
            ("        ctx.fsdp.prefetch(ctx.index - 1)  # backward runs in reverse: the previous layer is next\n",
             ""),
        ),
    ),
    "assumes_even_split": Mistake(
        why="cuts each layer into world_size pieces without padding: right only when the length divides evenly",
        edits=(
            ("            piece = -(-flat.numel() // self.world_size)  # ceil: the last piece is padded\n"
             "            flat = F.pad(flat, (0, piece * self.world_size - flat.numel()))\n",
             "            piece = flat.numel() // self.world_size  # every layer divides by 4\n"),
        ),
    ),
    "list_keeps_gathered": Mistake(
        why='A wrong FSDP lab: gathers with the list form of dist.all_gather and keeps every gathered layer alive.',
        edits=(
            (('from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older\n'
             '\n'),
             'from course.runtime.collective_names import reduce_scatter_single  # torch 2.13 names, or older\n'),
            ("        self.arriving = {}  # layer index -> (its full flat parameters, the gather's work handle)\n",
             ("        self.arriving = {}  # layer index -> (its full flat parameters, the gather's work handle)\n"
             '        self.kept = []\n')),
            (('            full = torch.empty(shard.numel() * self.world_size, dtype=shard.dtype, device=shard.device)\n'
             '            self.arriving[index] = full, all_gather_single(full, shard.detach(), async_op=True)\n'),
             ('            pieces = [torch.empty_like(shard) for _ in range(self.world_size)]\n'
             '            self.arriving[index] = pieces, dist.all_gather(pieces, shard.detach(), async_op=True)  # the list form\n')),
            ('        full, work = self.arriving.pop(index)\n',
             '        pieces, work = self.arriving.pop(index)\n'),
            ('        work.wait()\n',
             ('        work.wait()\n'
             '        self.kept.append(pieces)  # "cached" for later: every gathered layer stays alive\n'
             '        full = torch.cat(pieces)\n')),
            (('\n'
             'if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/fsdp.py\n'
             '    from course import world\n'
             '\n'
             '    me = world.init_from_env()\n'
             '    torch.manual_seed(0)  # the same model on every rank\n'
             '    model = MyFSDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)))\n'
             '    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)\n'
             '    torch.manual_seed(1 + me.rank)  # each rank its own data\n'
             '    for _step in range(3):\n'
             '        optimizer.zero_grad()\n'
             '        model(torch.randn(4, 8)).pow(2).mean().backward()\n'
             '        optimizer.step()\n'
             '    kept = sum(p.numel() for p in model.parameters())\n'
             '    print(f"rank {me.rank}: keeps {kept} of the model\'s parameters")\n'
             '    world.shutdown()\n'),
             ''),
        ),
    ),
    "waits_on_futures": Mistake(
        why="A wrong FSDP lab (stretch goal): each prefetch's future is waited for as soon as it is issued, and the handle waited again later: the data arrived before the layer before it computed, so nothing overlaps.",
        edits=(
            (('from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older\n'
             '\n'),
             'from course.runtime.collective_names import all_gather_single, reduce_scatter_single  # torch 2.13 names, or older\n'),
            ('            self.arriving[index] = full, all_gather_single(full, shard.detach(), async_op=True)\n',
             ('            work = all_gather_single(full, shard.detach(), async_op=True)\n'
             '            work.get_future().wait()  # waited for at once: nothing computes while it travels\n'
             '            self.arriving[index] = full, work\n')),
            (('\n'
             'if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/fsdp.py\n'
             '    from course import world\n'
             '\n'
             '    me = world.init_from_env()\n'
             '    torch.manual_seed(0)  # the same model on every rank\n'
             '    model = MyFSDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)))\n'
             '    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)\n'
             '    torch.manual_seed(1 + me.rank)  # each rank its own data\n'
             '    for _step in range(3):\n'
             '        optimizer.zero_grad()\n'
             '        model(torch.randn(4, 8)).pow(2).mean().backward()\n'
             '        optimizer.step()\n'
             '    kept = sum(p.numel() for p in model.parameters())\n'
             '    print(f"rank {me.rank}: keeps {kept} of the model\'s parameters")\n'
             '    world.shutdown()\n'),
             ''),
        ),
    ),
}
