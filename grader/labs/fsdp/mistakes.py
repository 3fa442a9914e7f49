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
}
