"""The one_f_one_b lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_one_f_one_b*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "gpipe": Mistake(
        why="GPipe's order, every forward then every backward: stage 0 holds all m micro-batches",
        edits=(
            ("    return phases(forwards, backwards, warmup=num_stages - stage - 1)\n",
             "    return forwards + backwards\n"),
        ),
    ),
    "interleaved_backward_chunk_order": Mistake(
        why="interleaved backward visits the chunks in forward order (chunk 0 first)",
        edits=(
            ('            backwards += [("B", i, chunks - 1 - chunk) for i in range(group, group + p)]\n',
             '            backwards += [("B", i, chunk) for i in range(group, group + p)]\n'),
        ),
    ),
    "interleaved_one_more_warmup": Mistake(
        why="interleaved warms up with one forward more than it needs",
        edits=(
            ("    warmup = (chunks - 1) * p + 2 * (p - stage - 1)\n",
             "    warmup = (chunks - 1) * p + 2 * (p - stage - 1) + 1\n"),
        ),
    ),
    "interleaved_plain_warmup": Mistake(
        why="interleaved warms up as plain 1F1B does, p - s - 1 forwards",
        edits=(
            ("    warmup = (chunks - 1) * p + 2 * (p - stage - 1)\n",
             "    warmup = p - stage - 1\n"),
        ),
    ),
    "no_cooldown": Mistake(
        why="forgets the backwards left after the steady phase",
        edits=(
            ("    return schedule + backwards[len(forwards) - warmup:]\n",
             "    return schedule\n"),
        ),
    ),
    "no_warmup": Mistake(
        why="no warm-up: every stage alternates F i, B i, so only one stage works at a time",
        edits=(
            ("    return phases(forwards, backwards, warmup=num_stages - stage - 1)\n",
             "    return phases(forwards, backwards, warmup=0)\n"),
        ),
    ),
    "reversed_warmup": Mistake(
        why="the warm-up counted from the wrong end (stage s runs s warm-up forwards)",
        edits=(
            ("    return phases(forwards, backwards, warmup=num_stages - stage - 1)\n",
             "    return phases(forwards, backwards, warmup=stage)\n"),
        ),
    ),
    "simulator_backward_never_waits": Mistake(
        why="idle_fraction lets a backward start without the next stage's backward",
        edits=(
            ("            if 0 <= needs[1] < p and needs not in finished:\n",
             '            if kind == "F" and 0 <= needs[1] < p and needs not in finished:\n'),
        ),
    ),
    "simulator_misses_deadlock": Mistake(
        why="idle_fraction stops at a round that runs nothing and returns, instead of raising",
        edits=(
            ('            raise ValueError(f"deadlock: every stage waits; the stages are at ops {position}")\n',
             "            break\n"),
        ),
    ),
    "uncapped_warmup": Mistake(
        why="p-stage-1 warm-up forwards even when there are fewer micro-batches than that",
        edits=(
            ('    """The order in which `stage` runs the forwards ("F", i) and backwards ("B", i) of micro-batches 0..m-1.\n'
             "\n"
             "    A forward of micro-batch i on stage s needs stage s-1's forward of i; a backward needs stage s+1's backward\n"
             "    of i. Micro-batches go forward in order 0, 1, 2, ... and backward in the same order. 1F1B has three phases:\n"
             "\n"
             "    1. warm-up: forwards only. How many, so that stage s is never idle while stage s+1 can still send it a\n"
             "       backward, yet holds as few micro-batches as possible? Mind num_micro_batches < num_stages.\n"
             "    2. steady: one forward, then one backward, in turn.\n"
             "    3. cool-down: the backwards that are left.\n"
             "\n"
             "    A stage holds a micro-batch's activations from its forward to its backward: 1F1B holds at most\n"
             "    num_stages - stage of them (GPipe, every forward first, holds all num_micro_batches).\n"
             '    """\n'
             '    forwards = [("F", i) for i in range(num_micro_batches)]\n'
             '    backwards = [("B", i) for i in range(num_micro_batches)]\n'
             "    return phases(forwards, backwards, warmup=num_stages - stage - 1)\n",
             '    """As in the lab (grader/labs/one_f_one_b/reference.py)."""\n'
             "    warmup = num_stages - stage - 1  # no min(..., num_micro_batches): right only while m >= p - 1\n"
             '    schedule = [("F", i) for i in range(warmup)]\n'
             "    for i in range(warmup, num_micro_batches):\n"
             '        schedule += [("F", i), ("B", i - warmup)]\n'
             '    return schedule + [("B", i) for i in range(num_micro_batches - warmup, num_micro_batches)]\n'),
        ),
    ),
    "warmup_off_by_one": Mistake(
        why="one warm-up forward too many: stage s holds p - s + 1 micro-batches",
        edits=(
            ("    return phases(forwards, backwards, warmup=num_stages - stage - 1)\n",
             "    return phases(forwards, backwards, warmup=num_stages - stage)\n"),
        ),
    ),
}
