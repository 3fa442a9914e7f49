"""What the ranks of one process group share in ``/dev/shm``: a mapped file, a barrier, and a header.

``course.collectives.shm_allreduce`` moves data through it; this module only sets it up and synchronises. Group rank 0
creates a file in ``/dev/shm``, every rank maps it, and rank 0 unlinks it at once (the mappings stay, so
nothing is left behind even if a rank dies). The file holds:

- a *control* region: one barrier counter per rank (:meth:`SharedGroup.barrier`: no socket, no message; a
  waiting rank sleeps on a late rank's counter with a futex), and a *header* of ``HEADER_ROW`` int64 per rank,
  twice (calls alternate between the two), where each rank describes its call so all can compare them;
- a *data* region of ``world_size + 1`` equal *slots* (one per rank, then the result), mapped again, larger,
  when a larger tensor comes (:meth:`SharedGroup.grow`: collective, every rank calls it alike), and reused
  by every later call. Pages are faulted in when mapped (``MAP_POPULATE``), not on first touch. (Huge pages
  would save TLB misses, but tmpfs gives them only where ``/sys/kernel/mm/transparent_hugepage/shmem_enabled``
  allows, which it often does not.)

Every rank of the group must run on one host (:func:`host` tells hosts apart, also across network namespaces,
which share /dev/shm). Taught in ``notebooks/05b_nodes.ipynb``.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import platform
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from course import world

SHM_DIR = "/dev/shm"
#: Slots start on cache-line boundaries, so ranks writing neighbouring slots never share a line.
_ALIGN = 64
#: int64 values per rank in the header: what the caller writes there to describe its call.
HEADER_ROW = 11
#: A waiting rank sleeps on a late rank's counter (woken as soon as that rank arrives) for at most this long
#: before it looks again; without futexes (not Linux) it polls, napping this long in between.
_WAIT_S = 10e-3
_POLL_S = 50e-6
BARRIER_TIMEOUT_S = 300.0
#: Map with every page faulted in at once (Linux): the first call does not pay a page fault per 4 KB.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


@dataclass
class _Mapping:
    """One shared file, mapped; ``raw`` is a uint8 tensor over all of it (the file itself is already unlinked)."""

    buffer: mmap.mmap
    raw: torch.Tensor


@dataclass
class SharedGroup:
    """What the ranks of one process group share: a header (one row per rank) and slots + result for data.
    Made by :func:`shared_group`."""

    rank: int
    world_size: int
    group: dist.ProcessGroup
    name: str  # file name prefix, the same on every rank of the group
    header: torch.Tensor  # (2, world_size, HEADER_ROW) int64, shared: calls alternate between the two
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
            counts = self.flags[:, 0].copy()  # one snapshot: a live view could change between argmin and the read
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


_groups: dict[object, SharedGroup] = {}
world.forget_on_shutdown(_groups.clear)  # a group kept past shutdown aborts ranks at exit

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


def shared_group(group: dist.ProcessGroup | None) -> SharedGroup:
    """The shared header and data of ``group``, set up on first use (collective: every rank of it calls)."""
    group = group if group is not None else dist.group.WORLD
    if group in _groups:
        return _groups[group]
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    hosts = [None] * world_size
    dist.all_gather_object(hosts, host(), group=group)
    if len(set(hosts)) > 1:
        raise ValueError(f"shm_allreduce needs every rank of the group on one host (they map one file in "
                         f"{SHM_DIR}), but the ranks run on {sorted(set(hosts))}. Use it within a node only, e.g. "
                         "as the intra-node level of course.collectives.hierarchical.hierarchical_allreduce, and "
                         "course.collectives.allreduce.ring_allreduce across nodes.")
    box = [f"course-shm-{uuid.uuid4().hex[:12]}"]
    dist.broadcast_object_list(box, group=group, group_src=0)
    shared = SharedGroup(rank, world_size, group, box[0], header=torch.empty(0), flags=np.empty(0))
    control = _map_together(shared, f"{box[0]}-control", (8 + 2 * HEADER_ROW) * world_size * 8)
    shared._keep.append(control)
    shared.flags = np.frombuffer(control.buffer, dtype=np.int64, count=8 * world_size).reshape(world_size, 8)
    shared.header = control.raw[8 * world_size * 8:].view(torch.int64).view(2, world_size, HEADER_ROW)
    _groups[group] = shared
    return shared


def _map_together(shared: SharedGroup, name: str, nbytes: int) -> _Mapping:
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
            buffer = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE)
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


def host() -> str:
    """Which machine this is: hostname and boot id (network namespaces on one machine share /dev/shm)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{socket.gethostname()}/{boot.read().strip()}"
    except OSError:
        return socket.gethostname()
