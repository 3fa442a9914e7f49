"""The pipeline_runner lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_pipeline_runner*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "keeps_last_only": Mistake(
        why="it keeps only the latest micro-batch's x and out, so a backward uses another's",
        edits=(
            ("            held[i] = (x, out)  # backward of i needs both\n",
             '            held = {"last": (x, out)}\n'),
            ("            x, out = held.pop(i)\n",
             '            x, out = held["last"]\n'),
        ),
    ),
    "no_wait": Mistake(
        why="it reads the activations it receives before the irecv has completed",
        edits=(
            ("                dist.irecv(x, rank - 1).wait()\n",
             "                dist.irecv(x, rank - 1)\n"),
        ),
    ),
    "wrong_peer": Mistake(
        why="backward sends the gradient of x forward, to rank + 1, where nobody receives it",
        edits=(
            ("                sends.append(dist.isend(x.grad.contiguous(), rank - 1))\n",
             "                sends.append(dist.isend(x.grad.contiguous(), (rank + 1) % dist.get_world_size()))\n"),
        ),
    ),
}
