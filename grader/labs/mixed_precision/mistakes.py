"""The mixed_precision lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_mixed_precision*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "clips_before_unscale": Mistake(
        why="clips the gradients before unscaling them (clips the scaled ones)",
        edits=(
            ("    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones\n"
             "    nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n",
             "    nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clips the scaled gradients\n"
             "    scaler.unscale_(optimizer)\n"),
        ),
    ),
    "never_skips": Mistake(
        why="steps the optimizer even when a gradient is inf or NaN",
        edits=(
            ("        if not self.found_inf:\n"
             "            optimizer.step()\n",
             "        optimizer.step()  # steps even when a gradient is inf\n"),
        ),
    ),
    "no_update": Mistake(
        why="never calls scaler.update(): the scale never changes",
        edits=(
            ("    scaler.step(optimizer)\n"
             "    scaler.update()\n",
             "    scaler.step(optimizer)  # the scale is never updated\n"),
        ),
    ),
    "uses_grad_scaler": Mistake(
        why="imports torch.amp's GradScaler, which the lab refuses",
        edits=(
            ("from torch import nn\n",
             "from torch import nn\n"
             "from torch.amp import GradScaler  # noqa: F401\n"),
        ),
    ),
    "never_scales": Mistake(
        why='Lab: a loss scaler and a mixed-precision training step (notebook 09). Check: course.labs.check("mixed_precision", "labs/loss_scaler.py"). fp16 keeps only 5 exponent bits: small gradients flush to zero. A loss scaler multiplies the loss by a large scale before backward, so the gradients are large enough, and divides them by it again before the optimizer sees them. When the scale is too large, a gradient overflows to inf: that step is skipped and the scale halved. You write what torch.amp.GradScaler does (using it is refused). The check trains with your code and with GradScaler, and makes one gradient inf at one step.',
        edits=(
            (('from torch import nn\n'
             '\n'),
             'from torch import nn\n'),
            ('        return loss * self._scale\n',
             '        return loss  # never scaled: with powers of two the steps are bit-identical, but fp16 would underflow\n'),
            ('                    p.grad.div_(self._scale)\n',
             '                    pass  # nothing to divide: the loss was never scaled\n'),
        ),
    ),
}
