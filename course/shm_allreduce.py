"""Allreduce through shared memory: the link inside a node that is faster than sockets.

On one host, NCCL does not send a GPU's data over TCP to the GPU next to it: it copies through NVLink or
through a buffer in shared memory. This is the second, on emulated GPUs (CPU processes): every rank of the
group maps the same file in ``/dev/shm`` (one *slot* per rank, plus a *result*), and::

    1. rank r copies its tensor into slot r, all but chunk r            # (n-1)/n of N bytes written
    2. barrier                                                          # every slot is full
    3. rank r adds its own chunk r (straight from its tensor) and       # reduce-scatter, no messages
       chunk r of every other slot into chunk r of the result
    4. barrier                                                          # every chunk of the result is final
    5. rank r copies the whole result into its tensor                   # all-gather, one read of N bytes

No byte goes through a socket, and no message is sent: a barrier is a counter per rank in the same shared
memory (:meth:`_SharedGroup.barrier`), and a waiting rank sleeps on it (a futex) rather than spin. Each rank
copies ``(n-1)/n·N`` bytes in and ``N`` out and reads ``n`` chunks of ``N/n`` to add them: about ``2N`` bytes
copied, against gloo's ``2(n-1)/n·N`` sent through the kernel's socket buffers (each byte copied into the
socket and out again, so twice that) plus the adds and gloo's own threads. ``benchmarks/shm_allreduce.py``
profiles the five steps.
The one-time cost is setting up the mapping per process group (and again when a larger tensor comes).

Same signature as ``course.allreduce``'s naive, ring and tree (``tensor, op, group, check``). Its halves,
:func:`shm_reduce` (steps 1-4, then only group rank 0 copies out) and :func:`shm_broadcast` (rank 0 writes the
result, the others copy it out), are the intra-node levels of ``course.hierarchical``. Taught in
``notebooks/05b_nodes.ipynb``; ``benchmarks/shm_allreduce.py`` measures it against gloo.

The agreement check (``check=True``) costs no message: each rank writes its call (numel, dtype, op, shape)
into its row of a small shared header before the first barrier, and after it every rank reads every row, so
all ranks raise the same ``ValueError`` together when one differs.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import platform
import socket
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from course.allreduce import DTYPES, OPS, Op, _op_name

SHM_DIR = "/dev/shm"
#: Slots start on cache-line boundaries, so ranks writing neighbouring slots never share a line.
_ALIGN = 64
#: Header row per rank: numel, dtype, op, kind, dim, then up to _CHECKED_DIMS sizes (later ones folded).
_CHECKED_DIMS = 6
_ROW = 5 + _CHECKED_DIMS
KINDS = ("allreduce", "reduce", "broadcast", "failed")
#: A waiting rank sleeps on a late rank's counter (woken as soon as that rank arrives) for at most this long
#: before it looks again; without futexes (not Linux) it polls, napping this long in between.
_WAIT_S = 10e-3
_POLL_S = 50e-6
BARRIER_TIMEOUT_S = 300.0


@dataclass
class _Mapping:
    """One shared file, mapped; ``raw`` is a uint8 tensor over all of it (the file itself is already unlinked)."""

    buffer: mmap.mmap
    raw: torch.Tensor


@dataclass
class _SharedGroup:
    """What the ranks of one process group share: a header (one row per rank) and slots + result for data."""

    rank: int
    world_size: int
    group: dist.ProcessGroup
    name: str  # file name prefix, the same on every rank of the group
    header: torch.Tensor  # (2, world_size, _ROW) int64, shared: calls alternate between the two
    flags: np.ndarray  # (world_size, 8) int64, shared: column 0 is each rank's barrier count
    epoch: int = 0  # barriers passed
    calls: int = 0  # calls so far: every rank counts the same
    data: _Mapping | None = None
    capacity: int = 0  # bytes per slot
    generation: int = 0  # data files created so far: every rank counts the same
    _keep: list[_Mapping] = field(default_factory=list)

    def barrier(self) -> None:
        """Wait until every rank of the group has reached this barrier: a flag per rank in shared memory.

        Each rank raises its own counter to the number of barriers it has passed and wakes whoever sleeps on
        it, then sleeps on the counter of a rank that has not got there yet (counters only grow, so no reset
        is needed). Sleeping (a futex on the shared counter), not spinning: with more ranks than cores, the
        ranks still copying need the core, and on a busy machine a spinning rank takes its share of the CPU
        from them. x86 keeps stores in order, so a peer that sees my counter also sees the data I wrote
        before it. No socket is involved (gloo's barrier took ~1 ms on 4 ranks sharing 2 cores)."""
        self.epoch += 1
        self.flags[self.rank, 0] = self.epoch
        _futex_wake(self.flags, self.rank)
        deadline = None
        while True:
            counts = self.flags[:, 0]
            late = int(counts.argmin())
            seen = int(counts[late])
            if seen >= self.epoch:
                return
            if not _futex_wait(self.flags, late, seen, _WAIT_S):
                time.sleep(_POLL_S)
            deadline = deadline or time.monotonic() + BARRIER_TIMEOUT_S
            if time.monotonic() > deadline:
                late = [k for k in range(self.world_size) if self.flags[k, 0] < self.epoch]
                raise RuntimeError(f"shm_allreduce: rank(s) {late} did not reach barrier {self.epoch} within "
                                   f"{BARRIER_TIMEOUT_S:g} s (I am rank {self.rank}). A rank died, or called "
                                   "shm_allreduce fewer times than the others.")

    def slot(self, k: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Rank ``k``'s slot (``k == world_size``: the result) as ``numel`` elements of ``dtype``."""
        start = k * self.capacity
        return self.data.raw[start:start + numel * dtype.itemsize].view(dtype)

    def grow(self, nbytes: int) -> None:
        """Map a data region with room for ``nbytes`` per slot (collective: every rank calls it alike)."""
        self.capacity = max(_ALIGN, math.ceil(nbytes / _ALIGN) * _ALIGN)
        self.generation += 1
        self.data = _map_together(self, f"{self.name}-data{self.generation}", (self.world_size + 1) * self.capacity)


_groups: dict[object, _SharedGroup] = {}

#: futex(2), to sleep on a word of shared memory until another process changes it (Linux, x86-64 or arm64).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True) if _SYS_FUTEX is not None and sys.platform == "linux" else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_wait(flags: np.ndarray, rank: int, seen: int, timeout_s: float) -> bool:
    """Sleep until rank's counter is no longer ``seen`` (or ``timeout_s``); False if futexes are unavailable.
    The kernel compares the counter's low 32 bits with ``seen`` atomically, so a wake cannot be missed."""
    if _libc is None:
        return False
    whole, frac = divmod(timeout_s, 1.0)
    timeout = _Timespec(int(whole), int(frac * 1e9))
    address = flags.ctypes.data + rank * flags.strides[0]  # the int64's low half (little-endian)
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(seen & 0xFFFFFFFF),
                  ctypes.byref(timeout), None, 0)
    return True


def _futex_wake(flags: np.ndarray, rank: int) -> None:
    """Wake every process sleeping on rank's counter."""
    if _libc is not None:
        address = flags.ctypes.data + rank * flags.strides[0]
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 1 << 30, None, None, 0)


def shm_allreduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
                  check: bool = True) -> torch.Tensor:
    """Allreduce through a buffer in shared memory that every rank of ``group`` maps (module docstring).

    Args:
        tensor: contiguous float16/bfloat16/float32/float64 CPU tensor, any shape, same shape and dtype on
            every rank. Overwritten with the result.
        op: ``"sum"`` or ``"avg"`` (or ``dist.ReduceOp.SUM`` / ``dist.ReduceOp.AVG``).
        group: process group whose ranks all run on this host; ``None`` for the default group (or, outside
            any process group, a world of one: a no-op).
        check: compare every rank's numel, shape, dtype and op (through the shared header: no extra message)
            and raise on every rank if any differs. ``check=False`` means you promise they agree; a rank with
            a larger tensor would then read past the others' data.

    Returns:
        ``tensor`` itself, now holding the reduction on every rank.

    Raises:
        ValueError: bad ``op``, dtype, device or layout; ranks that disagree (with ``check``); ranks of the
            group on different hosts (they cannot share memory: use ``course.allreduce.ring_allreduce``).
    """
    shared, flat = _begin("allreduce", tensor, op, group, check)
    if shared is not None:
        _reduce_my_chunk(shared, flat)
        shared.barrier()  # every chunk of the result is final
        _copy_out(shared, flat, op)
    return tensor


def shm_reduce(tensor: torch.Tensor, op: Op = "sum", group: dist.ProcessGroup | None = None, *,
               check: bool = True) -> torch.Tensor:
    """Reduce to group rank 0 through shared memory: :func:`shm_allreduce` without the other ranks' copy out.

    The first level of ``course.hierarchical``: the node's sum lands on its leader. Arguments as
    :func:`shm_allreduce`; ``tensor`` holds the result on group rank 0 and is left as it was elsewhere.
    """
    shared, flat = _begin("reduce", tensor, op, group, check)
    if shared is not None:
        _reduce_my_chunk(shared, flat)
        shared.barrier()
        if shared.rank == 0:
            _copy_out(shared, flat, op)
    return tensor


def shm_broadcast(tensor: torch.Tensor, group: dist.ProcessGroup | None = None, *, check: bool = True,
                  failed: bool = False) -> torch.Tensor:
    """Copy group rank 0's ``tensor`` into every rank's, through shared memory (rank 0 writes, the rest read).

    The last level of ``course.hierarchical``. Arguments as :func:`shm_allreduce`. ``failed=True`` on rank 0
    says its work before the broadcast failed (it will raise): every other rank raises instead of waiting.

    Raises:
        ValueError: as :func:`shm_allreduce`, and on the other ranks when rank 0 passed ``failed=True``.
    """
    shared, flat = _begin("failed" if failed else "broadcast", tensor, "sum", group, check)
    if shared is not None:
        if shared.rank == 0:  # after the first barrier: every rank has finished reading the last call's result
            shared.slot(shared.world_size, flat.numel(), flat.dtype).copy_(flat)
        shared.barrier()  # rank 0's tensor is in place
        if shared.rank != 0:
            flat.copy_(shared.slot(shared.world_size, flat.numel(), flat.dtype))
    return tensor


def _begin(kind: str, tensor: torch.Tensor, op: Op, group: dist.ProcessGroup | None, check: bool
           ) -> tuple[_SharedGroup | None, torch.Tensor]:
    """Validate; write my call into the header and (unless a broadcast) my tensor into my slot; first barrier;
    compare the calls. Returns the group's shared memory and the flat tensor, or ``(None, flat)`` when there is
    nothing to move (a world of one, or no elements)."""
    op = _op_name(op)
    _validate(tensor)
    flat, nbytes = tensor.view(-1), tensor.numel() * tensor.element_size()
    if group is None and not dist.is_initialized():
        return None, flat  # a world of one
    shared = _shared_group(group)
    if shared.world_size == 1:
        return None, flat
    # Alternate headers: a rank that returns early (numel 0) may write its next call's row while a slower one
    # still reads this call's rows; two calls later everyone has passed this call's first barrier.
    header = shared.header[shared.calls % 2]
    shared.calls += 1
    header[shared.rank] = _call(tensor, op, kind)
    fits, writes = nbytes <= shared.capacity, kind in ("allreduce", "reduce")
    if fits and nbytes and writes:
        _copy_in(shared, flat)
    shared.barrier()  # every header row and (if it fitted) every slot is written
    rows = header.clone()
    _raise_if_failed(rows, shared.rank)
    if check:
        _verify(rows, shared.rank)
    if nbytes == 0:
        return None, flat
    if not fits:  # every rank decides alike: same nbytes (checked, or promised), same capacity
        shared.grow(nbytes)
        if writes:
            _copy_in(shared, flat)
        shared.barrier()
    return shared, flat


def _my_chunk(shared: _SharedGroup, numel: int) -> tuple[int, int]:
    """``(start, stop)`` of the chunk this rank reduces: ``course.allreduce.chunk_bounds``' split."""
    base, extra = divmod(numel, shared.world_size)
    start = shared.rank * base + min(shared.rank, extra)
    return start, start + base + (shared.rank < extra)


def _copy_in(shared: _SharedGroup, flat: torch.Tensor) -> None:
    """Step 1: my tensor into my slot, all but my own chunk (I read that one straight from my tensor)."""
    start, stop = _my_chunk(shared, flat.numel())
    slot = shared.slot(shared.rank, flat.numel(), flat.dtype)
    slot[:start].copy_(flat[:start])
    slot[stop:].copy_(flat[stop:])


def _reduce_my_chunk(shared: _SharedGroup, flat: torch.Tensor) -> None:
    """Step 3: result chunk r = my tensor's chunk r + every other slot's chunk r, in rank order after mine,
    accumulated in place in the result (no temporary). Adding in cache-sized blocks was slower here (the
    chunks of 16 MB on 4 ranks fit in L3; the extra calls cost more than they saved)."""
    n, numel = shared.world_size, flat.numel()
    start, stop = _my_chunk(shared, numel)
    if stop == start:
        return
    result = shared.slot(n, numel, flat.dtype)[start:stop]
    others = [shared.slot(k, numel, flat.dtype)[start:stop] for k in range(n) if k != shared.rank]
    torch.add(flat[start:stop], others[0], out=result)
    for other in others[1:]:
        result.add_(other)


def _copy_out(shared: _SharedGroup, flat: torch.Tensor, op: Op) -> None:
    """Step 5: the whole result into my tensor, divided by the world size on the way for ``"avg"``."""
    result = shared.slot(shared.world_size, flat.numel(), flat.dtype)
    if _op_name(op) == "avg":
        torch.div(result, shared.world_size, out=flat)
    else:
        flat.copy_(result)


def _validate(tensor: torch.Tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"shm_allreduce needs a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype not in DTYPES:
        raise ValueError(f"shm_allreduce supports dtypes {[str(d) for d in DTYPES]}, got {tensor.dtype}. "
                         "Convert with tensor.float() (and copy back) first.")
    if tensor.device.type != "cpu":
        raise ValueError(f"shm_allreduce maps host memory, so it needs a CPU tensor, got one on {tensor.device}. "
                         "On GPUs use dist.all_reduce (NCCL moves data through NVLink or shared memory itself).")
    if not tensor.is_contiguous():
        raise ValueError(f"shm_allreduce works in place on a contiguous tensor, got one with strides "
                         f"{tensor.stride()} for shape {tuple(tensor.shape)}. Reduce t = x.contiguous(), "
                         "then x.copy_(t).")


def _call(tensor: torch.Tensor, op: str, kind: str) -> torch.Tensor:
    """This rank's header row: what every rank must agree on."""
    shape = list(tensor.shape[:_CHECKED_DIMS]) + [0] * max(0, _CHECKED_DIMS - tensor.dim())
    if tensor.dim() > _CHECKED_DIMS:
        shape[-1] = math.prod(tensor.shape[_CHECKED_DIMS - 1:])
    return torch.tensor([tensor.numel(), DTYPES.index(tensor.dtype), OPS.index(op), KINDS.index(kind),
                         tensor.dim(), *shape],
                        dtype=torch.int64)


def _describe(row: list[int]) -> str:
    numel, dtype, op, kind, dim, *shape = row
    return f"numel {numel}, shape {tuple(shape[:dim])}, {DTYPES[dtype]}, op {OPS[op]!r}, shm_{KINDS[kind]}"


def _raise_if_failed(header: torch.Tensor, rank: int) -> None:
    failed = [k for k, row in enumerate(header.tolist()) if row[3] == KINDS.index("failed")]
    if failed:
        raise ValueError(f"rank {failed[0]} of this group (a node's leader) failed before its broadcast, so it "
                         f"sends none; it raises the reason itself (e.g. ranks on another node called with another "
                         f"shape). I am rank {rank} of the group.")


def _verify(header: torch.Tensor, rank: int) -> None:
    """Raise (on every rank alike: they read the same header) if any rank's row differs from rank 0's."""
    rows = header.tolist()
    odd = [k for k, row in enumerate(rows) if row != rows[0]]
    if odd:
        raise ValueError(
            f"shm_allreduce needs the same tensor shape, dtype and op (and the same call) on every rank, but "
            f"rank {odd[0]} has "
            f"{_describe(rows[odd[0]])} while rank 0 has {_describe(rows[0])} (ranks that differ from rank 0: "
            f"{odd}; I am rank {rank}). Call it with the same-shaped tensor on every rank.")


def _shared_group(group: dist.ProcessGroup | None) -> _SharedGroup:
    """The shared header and data of ``group``, set up on first use (collective: every rank of it calls)."""
    group = group if group is not None else dist.group.WORLD
    if group in _groups:
        return _groups[group]
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    hosts = [None] * world_size
    dist.all_gather_object(hosts, _host(), group=group)
    if len(set(hosts)) > 1:
        raise ValueError(f"shm_allreduce needs every rank of the group on one host (they map one file in "
                         f"{SHM_DIR}), but the ranks run on {sorted(set(hosts))}. Use it within a node only, e.g. "
                         "as the intra-node level of course.hierarchical.hierarchical_allreduce, and "
                         "course.allreduce.ring_allreduce across nodes.")
    box = [f"course-shm-{uuid.uuid4().hex[:12]}"]
    dist.broadcast_object_list(box, group=group, group_src=0)
    shared = _SharedGroup(rank, world_size, group, box[0], header=torch.empty(0), flags=np.empty(0))
    control = _map_together(shared, f"{box[0]}-control", (8 + 2 * _ROW) * world_size * 8)
    shared._keep.append(control)
    shared.flags = np.frombuffer(control.buffer, dtype=np.int64, count=8 * world_size).reshape(world_size, 8)
    shared.header = control.raw[8 * world_size * 8:].view(torch.int64).view(2, world_size, _ROW)
    _groups[group] = shared
    return shared


def _map_together(shared: _SharedGroup, name: str, nbytes: int) -> _Mapping:
    """Group rank 0 creates ``/dev/shm/<name>`` of ``nbytes``; every rank maps it; then rank 0 unlinks it (the
    mappings stay: nothing is left in /dev/shm even if a rank dies later). Collective."""
    path = os.path.join(SHM_DIR, name)
    if shared.rank == 0:
        with open(path, "wb") as created:
            created.truncate(nbytes)
    shared.group.barrier().wait()
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            buffer = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        error = ""
    except OSError as failure:
        buffer, error = None, f"{type(failure).__name__}: {failure}"
    errors = [None] * shared.world_size
    dist.all_gather_object(errors, error, group=shared.group)
    if shared.rank == 0:
        os.unlink(path)
    if any(errors):
        bad = [k for k, e in enumerate(errors) if e]
        raise ValueError(f"shm_allreduce: rank(s) {bad} could not map {path} ({errors[bad[0]]}). Every rank of the "
                         f"group must run on this host and be able to write {SHM_DIR}.")
    return _Mapping(buffer, torch.frombuffer(buffer, dtype=torch.uint8))


def _host() -> str:
    """Which machine this is: hostname and boot id (network namespaces on one machine share /dev/shm)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{socket.gethostname()}/{boot.read().strip()}"
    except OSError:
        return socket.gethostname()


def copy_bandwidth(nbytes: int = 16 << 20, repeats: int = 5) -> float:
    """Rank function: this machine's memory copy bandwidth with every rank copying at once, in bytes per second
    per rank (median of ``repeats``; bytes copied, i.e. read once and written once, as STREAM's Copy counts
    half its traffic). The physical limit of :func:`shm_allreduce` here: it copies about 3 tensors' worth per
    rank and per call."""
    source, target = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    target.copy_(source)  # touch the pages first: page faults are not bandwidth
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return nbytes / slowest.item()
