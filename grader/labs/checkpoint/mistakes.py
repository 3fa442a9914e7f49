"""The checkpoint lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_checkpoint*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "every_rank_writes": Mistake(
        why="every rank writes the checkpoint (each its own partial file), not rank 0 alone",
        edits=(
            ("    if dist.get_rank() == 0:\n"
             '        partial = str(path) + ".partial"\n',
             "    if True:  # every rank writes the same file\n"
             '        partial = f"{path}.partial{dist.get_rank()}"\n'),
        ),
    ),
    "forgets_optimizer": Mistake(
        why="the optimizer's state (momentum) is neither saved nor loaded",
        edits=(
            ('        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),\n',
             '        torch.save({"model": model.module.state_dict(),   # no optimizer state\n'),
            ('    optimizer.load_state_dict(checkpoint["optimizer"])\n',
             ""),
        ),
    ),
    "forgets_rng": Mistake(
        why="torch's random number generator state is saved but never set back",
        edits=(
            ('    torch.set_rng_state(mine["torch"])\n',
             ""),
        ),
    ),
    "no_barrier": Mistake(
        why="no barrier after the write: the other ranks go on before the file is complete",
        edits=(
            ("    dist.barrier()  # nobody goes on (or loads) before the file is complete\n",
             "    # no barrier: rank 1 returns before rank 0 has written\n"),
        ),
    ),
    "writes_in_place": Mistake(
        why="writes straight onto the checkpoint, no os.replace: a crash mid-write tears it",
        edits=(
            ('        partial = str(path) + ".partial"\n',
             "        partial = path  # written in place\n"),
            ("        os.replace(partial, path)  # atomic: readers see the old file or the new one, never half of one\n",
             ""),
        ),
    ),
}
