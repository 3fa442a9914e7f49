"""Wrong attempt (ring_attention): the merge exponentiates each lse without subtracting the running maximum."""

import math

import torch
import torch.distributed as dist

STUDENT_ID = ""  # your student id (the one you log in with): the check draws your own variant from it


# Given: attention of some queries to one block of keys, and that block's gradients. Use them as they are.
def block_attention(q, k, v, q_pos, k_pos):
    """q: (B, H, Lq, D) at positions q_pos; k, v: (B, H, Lk, D) at positions k_pos. A query at position i sees
    the keys at positions j <= i. Returns (out, lse): (B, H, Lq, D) over this block alone, and its (B, H, Lq)
    log-sum-exp (-inf for a row that sees no key of the block; its out is 0)."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.clamp_min(torch.finfo(s.dtype).min)[..., None]) @ v, lse


def block_backward(dout, q, k, v, out, lse, q_pos, k_pos):
    """The gradients one block of keys contributes, from the queries' FINAL out and lse (over every block).
    Returns (dq, dk, dv): dq for these queries (sum it over the blocks), dk and dv for this block's keys."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    ds = p * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
    return ds @ k, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ dout


# Yours: the layout, the merge, and the ring, forward and backward. Send with dist.isend / dist.irecv only:
# one message per step in forward (keys and values stacked in one tensor) to rank + 1, received from rank - 1.
def zigzag_positions(rank, world_size, seq_len):
    """The positions rank holds: cut 0 .. seq_len-1 into 2 * world_size equal chunks; rank r holds chunk r and
    chunk 2 * world_size - 1 - r, in that order. Returns a 1-D LongTensor."""
    chunk = seq_len // (2 * world_size)
    late = 2 * world_size - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(late * chunk, (late + 1) * chunk)])


def merge(out_a, lse_a, out_b, lse_b):
    """Two partial attentions of the same queries over different keys -> over both: (out, lse)."""
    w_a, w_b = torch.exp(lse_a), torch.exp(lse_b)  # no running maximum: overflows past e^88
    total = w_a + w_b
    out = (w_a[..., None] * out_a + w_b[..., None] * out_b) / total.clamp_min(1e-30)[..., None]
    return out, torch.log(total)


def _send_receive(block, rank, world_size):
    """Post the send of block to the next rank and the receive of the previous rank's.
    Returns (requests, buffer): wait every request before reading the buffer."""
    incoming = torch.empty_like(block)
    requests = [dist.isend(block, (rank + 1) % world_size), dist.irecv(incoming, (rank - 1) % world_size)]
    return requests, incoming


def ring_attention_forward(q, k, v, layout):
    """q, k, v: (B, H, L, D), this rank's positions layout[rank]; layout[r]: the positions rank r holds.
    Returns (out, lse) of causal attention of this rank's queries over the whole sequence.

    At step s this rank holds the keys and values of rank (rank - s) % world_size. Before computing on them,
    post their isend to rank + 1 and an irecv from rank - 1 (world_size - 1 times in all), so that the next
    block travels while this one is computed; wait both requests before using the received block."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v]).contiguous()
    out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], -math.inf, device=q.device)
    for step in range(world_size):
        if step < world_size - 1:
            requests, incoming = _send_receive(kv, rank, world_size)  # the next block travels meanwhile
        source = (rank - step) % world_size
        out, lse = merge(out, lse, *block_attention(q, kv[0], kv[1], layout[rank], layout[source]))
        if step < world_size - 1:
            for request in requests:
                request.wait()
            kv = incoming
    return out, lse


def ring_attention_backward(dout, q, k, v, out, lse, layout):
    """dout: (B, H, L, D), the gradient of this rank's out; out, lse: the forward's. Returns (dq, dk, dv) of
    this rank's positions.

    Run the same ring. The dK, dV of the block you hold build up on every rank that uses it: after each step,
    send your partial dK, dV of that block on to rank + 1 (and receive the next one from rank - 1). After the
    last step, the block's finished gradients arrive where they belong."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v]).contiguous()
    dkv, dq = torch.zeros_like(kv), torch.zeros_like(q)
    for step in range(world_size):
        if step < world_size - 1:
            requests, incoming = _send_receive(kv, rank, world_size)
        source = (rank - step) % world_size
        dq_b, dk_b, dv_b = block_backward(dout, q, kv[0], kv[1], out, lse, layout[rank], layout[source])
        dq = dq + dq_b
        dkv = dkv + torch.stack([dk_b, dv_b])
        returning, dkv = _send_receive(dkv.contiguous(), rank, world_size)  # the partial dK, dV follow the block
        for request in returning:
            request.wait()
        if step < world_size - 1:
            for request in requests:
                request.wait()
            kv = incoming
    return dq, dkv[0], dkv[1]


if __name__ == "__main__":  # torchrun --nproc_per_node=4 labs/ring_attention.py
    from course import world

    me = world.init_from_env()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 4) for _ in range(3))
    layout = [zigzag_positions(r, me.world_size, 32) for r in range(me.world_size)]
    mine = layout[me.rank]
    out, lse = ring_attention_forward(q[..., mine, :], k[..., mine, :], v[..., mine, :], layout)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)[..., mine, :]
    world.print0(f"ring attention on {me.world_size} ranks differs from full attention by "
                 f"{(out - whole).abs().max().item():.2e}")
    world.shutdown()
