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
    "copies_over_target": Mistake(
        why='Lab: a full checkpoint under DDP, resumed bit-for-bit (notebook 09). Check: course.labs.check("checkpoint", "labs/checkpoint_resume.py"). A job that stops at step k and resumes from your checkpoint must end with the same parameters, to the last bit, as a job that never stopped. So the checkpoint holds everything a step depends on: the model, the optimizer\'s state (momentum), the learning-rate scheduler, where the data stream was (epoch and step), and every rank\'s random number generator (dropout draws from it, and each rank draws its own). Using course.practice.checkpoint is refused: this is that module, written by you.',
        edits=(
            ('import os\n',
             'import os  # noqa: F401 - a rename would need it\n'),
            ('import random\n',
             ('import random\n'
             'import shutil\n')),
            (('import torch.distributed as dist\n'
             '\n'),
             'import torch.distributed as dist\n'),
            ('        os.replace(partial, path)  # atomic: readers see the old file or the new one, never half of one\n',
             '        shutil.copy(partial, path)  # "atomic"? a crash in the middle of the copy leaves half a file at path\n'),
        ),
    ),
}
