"""The moe_dispatch lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_moe_dispatch*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "imports_course": Mistake(
        why="the course's count exchange instead of one's own.",
        edits=(
            ('import torch.distributed as dist\n',
             'import torch.distributed as dist\n\nfrom course.experts.expert_parallel import exchange_counts as course_exchange\n'),
            (('    received = torch.empty_like(counts)\n'
             '    dist.all_to_all_single(received, counts)\n'
             '    return received.reshape(dist.get_world_size(), -1)\n'),
             '    return course_exchange(counts)\n'),
        ),
    ),
    "ignores_capacity": Mistake(
        why='dispatch sends every assignment, over capacity or not.',
        edits=(
            ('    token, choice = kept.nonzero(as_tuple=True)\n',
             '    token, choice = torch.ones_like(kept).nonzero(as_tuple=True)  # capacity ignored\n'),
        ),
    ),
    "no_count_exchange": Mistake(
        why='no exchange of the split sizes: each rank takes its own counts for what it receives.',
        edits=(
            (('    received = torch.empty_like(counts)\n'
             '    dist.all_to_all_single(received, counts)\n'
             '    return received.reshape(dist.get_world_size(), -1)\n'),
             '    return counts.reshape(dist.get_world_size(), -1)  # assumes it receives what it sends\n'),
        ),
    ),
    "no_gates": Mistake(
        why='combine adds the returned rows without their gates.',
        edits=(
            (('    weighted = gates[plan.token, plan.choice, None] * returned\n'
             '    return torch.zeros(num_tokens, expert_out.shape[1], device=expert_out.device).index_add(0, plan.token, weighted)\n'),
             '    return torch.zeros(num_tokens, expert_out.shape[1], device=expert_out.device).index_add(0, plan.token, returned)\n'),
        ),
    ),
    "out_of_order": Mistake(
        why='combine adds the returned rows in the order they came back, not at their tokens.',
        edits=(
            ('    return torch.zeros(num_tokens, expert_out.shape[1], device=expert_out.device).index_add(0, plan.token, weighted)\n',
             ('    arrival = torch.arange(len(plan.token), device=expert_out.device) % num_tokens  # the order rows came back\n'
             '    return torch.zeros(num_tokens, expert_out.shape[1], device=expert_out.device).index_add(0, arrival, weighted)\n')),
        ),
    ),
}
