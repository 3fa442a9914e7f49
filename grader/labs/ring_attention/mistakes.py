"""The ring_attention lab's planted mistakes: small edits of ``reference.py`` (see :mod:`grader.labs.mistakes`).

Which checks each must fail, and what the message says: ``tests/grader/labs/test_ring_attention*.py``.
"""

from grader.labs.mistakes import Mistake

MISTAKES: dict[str, Mistake] = {
    "imports_course": Mistake(
        why="the course's ring attention instead of one's own.",
        edits=(
            ('import torch.distributed as dist\n',
             'import torch.distributed as dist\n\nfrom course.long_context.ring_attention import ring_forward\n'),
            ('def ring_attention_forward(q, k, v, layout):\n',
             ('def ring_attention_forward(q, k, v, layout):\n'
              '    return ring_forward(q, k, v, layout)\n\n\ndef _unused_forward(q, k, v, layout):\n')),
        ),
    ),
    "mask_wrong_blocks": Mistake(
        why="each block is masked with this rank's own positions, not those of the keys it holds.",
        edits=(
            (('        source = (rank - step) % world_size\n'
             '        out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], layout[rank], layout[source]))\n'),
             ('        source = (rank - step) % world_size  # noqa: F841 - computed, then not used: the mistake\n'
             '        out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], layout[rank], layout[rank]))\n')),
            (('        source = (rank - step) % world_size\n'
             '        dq_b, dk_b, dv_b = block_backward(dout, q, kv[0], kv[1], out, lse, layout[rank], layout[source])\n'),
             ('        source = (rank - step) % world_size  # noqa: F841 - computed, then not used: the mistake\n'
             '        dq_b, dk_b, dv_b = block_backward(dout, q, kv[0], kv[1], out, lse, layout[rank], layout[rank])\n')),
        ),
    ),
    "merge_no_max": Mistake(
        why='the merge exponentiates each lse without subtracting the running maximum.',
        edits=(
            (('    m = torch.maximum(lse_a, lse_b)\n'
             '    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both -inf: nothing seen yet\n'
             '    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)\n'),
             '    w_a, w_b = torch.exp(lse_a), torch.exp(lse_b)  # no running maximum: overflows past e^88\n'),
            ('    return out, m + torch.log(total)\n',
             '    return out, torch.log(total)\n'),
        ),
    ),
    "wrong_neighbour": Mistake(
        why='the ring turns the other way: blocks go to rank - 1 and come from rank + 1.',
        edits=(
            ('    requests = [dist.isend(block, (rank + 1) % world_size), dist.irecv(incoming, (rank - 1) % world_size)]\n',
             '    requests = [dist.isend(block, (rank - 1) % world_size), dist.irecv(incoming, (rank + 1) % world_size)]\n'),
            (('            requests, incoming = _send_receive(kv, rank, world_size)  # the next block travels meanwhile\n'
             '        source = (rank - step) % world_size\n'),
             ('            requests, incoming = _send_receive(kv, rank, world_size)  # the next block travels meanwhile\n'
             '        source = (rank + step) % world_size\n')),
            (('            requests, incoming = _send_receive(kv, rank, world_size)\n'
             '        source = (rank - step) % world_size\n'),
             ('            requests, incoming = _send_receive(kv, rank, world_size)\n'
             '        source = (rank + step) % world_size\n')),
        ),
    ),
    "no_return_trip": Mistake(
        why="backward keeps the dK, dV it holds after the last step instead of sending them home.",
        edits=(
            (('        returning, dkv = _send_receive(dkv.contiguous(), rank, world_size)  # the partial dK, dV follow the block\n'
              '        for request in returning:\n'
              '            request.wait()\n'
              '        if step < world_size - 1:\n'),
             ('        if step < world_size - 1:\n'
              '            returning, dkv = _send_receive(dkv.contiguous(), rank, world_size)\n'
              '            for request in returning:\n'
              '                request.wait()\n')),
        ),
    ),
}
