"""The ring lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_ring*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "adds_own_chunk_twice": Mistake(
        why="after the reduce-scatter a rank adds its own input to its complete chunk (already in it)",
        edits=(
            ("    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views: writing a chunk writes `tensor`\n",
             "    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views: writing a chunk writes `tensor`\n"
             "    own = torch.tensor_split(tensor.clone().view(-1), world_size)\n"),
            ("        into += arrived\n",
             "        into += arrived\n"
             "    mine = (rank + 1) % world_size\n"
             '    chunks[mine].add_(own[mine])  # "now add my part": it was in there already\n'),
        ),
    ),
    "averages_twice": Mistake(
        why="it averages after the reduce-scatter and again at the end",
        edits=(
            ("        into += arrived\n",
             "        into += arrived\n"
             '    if op == "avg":\n'
             "        chunks[(rank + 1) % world_size].div_(world_size)\n"),
        ),
    ),
    "barrier_at_end": Mistake(
        why="a correct ring, then dist.barrier() \"to be safe\" (a collective)",
        edits=(
            ("        tensor /= world_size\n",
             "        tensor /= world_size\n"
             "    dist.barrier()\n"),
        ),
    ),
    "calls_all_reduce": Mistake(
        why="it hands the work to dist.all_reduce",
        edits=(
            ("    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views: writing a chunk writes `tensor`\n",
             "    chunks = torch.tensor_split(tensor.view(-1), world_size)  # views: writing a chunk writes `tensor`\n"
             "    dist.all_reduce(tensor)\n"
             '    if op == "avg":\n'
             "        tensor /= world_size\n"
             "    return tensor\n"),
        ),
    ),
    "chunk_off_by_one": Mistake(
        why="the all-gather receives into the chunk index of the step before (off by one): on uneven chunks sizes differ",
        edits=(
            ("        exchange(chunks[(rank + 1 - step) % world_size], chunks[(rank - step) % world_size], right, left)\n",
             "        exchange(chunks[(rank + 1 - step) % world_size], chunks[(rank - step - 1) % world_size], right, left)\n"),
        ),
    ),
    "forgets_average": Mistake(
        why="op=\"avg\" returns the sum",
        edits=(
            ('    if op == "avg":\n'
             "        tensor /= world_size\n",
             ""),
        ),
    ),
    "sends_whole_tensor": Mistake(
        why="every step sends the whole tensor and the receiver picks the chunk it needs",
        edits=(
            ("        into = chunks[(rank - step - 1) % world_size]\n"
             "        arrived = torch.empty_like(into)\n"
             "        exchange(chunks[(rank - step) % world_size], arrived, right, left)\n"
             "        into += arrived\n",
             "        index = (rank - step - 1) % world_size\n"
             "        arrived = torch.empty_like(tensor)\n"
             "        exchange(tensor, arrived, right, left)\n"
             "        chunks[index].add_(torch.tensor_split(arrived.view(-1), world_size)[index])\n"),
        ),
    ),
}
