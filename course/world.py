"""Devices and ranks: find the GPUs, or emulate N of them as N CPU processes.

Everything in the course that asks "which device?", "which backend?" or "which rank am I?" asks this
module, so the same code picks ``nccl`` + ``cuda:<local_rank>`` on a GPU node and ``gloo`` + ``cpu`` on a
laptop. Taught in ``notebooks/00_start_here.ipynb``.

Inside a torchrun script::

    rank = world.init_from_env()      # process group from torchrun's environment
    model.to(rank.device)
    world.print0("only rank 0 prints this")
    world.shutdown()
"""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course.arguments import check_count

#: Each emulated GPU is a whole process; past this many, a 2-core laptop only thrashes.
MAX_EMULATED_WORLD_SIZE = 64
#: Set to 1 to emulate GPUs with CPU processes even on a machine that has GPUs.
EMULATE_ENV = "COURSE_EMULATE"
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Hardware:
    """What this machine offers for distributed training.

    Attributes:
        gpu_names: one name per visible CUDA device (empty when there are none or emulation is forced).
        cpu_count: logical CPU cores.
        device_type: the GPUs' device type, ``cuda``. The device check of the tests (``tests/device``) declares
            ``meta`` instead, so that a tensor left on the CPU is caught on a machine with no GPU.
    """

    gpu_names: tuple[str, ...]
    cpu_count: int
    device_type: str = "cuda"

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    @property
    def emulated(self) -> bool:
        """True when there is no GPU: every launch runs its ranks as CPU processes."""
        return self.gpu_count == 0

    def on_gpus(self, world_size: int) -> bool:
        """True when ``world_size`` ranks (on one machine) each get a GPU of their own; False when they are emulated
        by CPU processes: no GPU, or fewer GPUs than ranks (nccl needs one GPU per rank)."""
        return 0 < world_size <= self.gpu_count

    @property
    def backend(self) -> str:
        """``nccl`` when there are GPUs (one rank per GPU), ``gloo`` for emulated ones."""
        return "gloo" if self.emulated else "nccl"

    def backend_for(self, world_size: int) -> str:
        """The backend ``world_size`` ranks on this machine use: ``nccl`` on their own GPUs, else ``gloo``."""
        return "nccl" if self.on_gpus(world_size) else "gloo"

    def describe(self, world_size: int) -> str:
        """One sentence saying what running exactly ``world_size`` ranks means on this machine (:func:`plan`'s)."""
        return _sentence(self, world_size, world_size, f"Use world_size <= {self.gpu_count} to run on the GPU(s).")


def detect_hardware() -> Hardware:
    """Find the CUDA devices, unless ``COURSE_EMULATE=1`` asks to emulate them.

    Returns:
        A :class:`Hardware` describing GPUs (by name) and CPU cores.
    """
    cpu_count = os.cpu_count() or 1
    if os.environ.get(EMULATE_ENV) == "1" or not torch.cuda.is_available():
        return Hardware(gpu_names=(), cpu_count=cpu_count)
    names = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return Hardware(gpu_names=names, cpu_count=cpu_count)


@dataclass(frozen=True)
class Plan:
    """How many ranks a lesson runs on this machine, on which backend and devices, and the sentence saying so.

    Attributes:
        asked: the ranks the lesson was written for.
        world_size: the ranks it runs: ``asked``, or fewer where only that many GPUs are here.
        backend: ``nccl`` (one GPU per rank) or ``gloo`` (CPU processes emulating the GPUs).
        devices: each rank's device, by rank (``cuda:0``, ``cuda:1``, ... or ``cpu``).
        sentence: what to print above the lesson's output.
    """

    asked: int
    world_size: int
    backend: str
    devices: tuple[str, ...]
    sentence: str

    @property
    def on_gpus(self) -> bool:
        return self.backend == "nccl"

    @property
    def label(self) -> str:
        """``"2 GPUs"`` or ``"4 emulated GPUs"``: what a plot's title or a printed line says the ranks ran on."""
        return f"{self.world_size} {'GPUs' if self.on_gpus else 'emulated GPUs'}"


def _gpu_sizes(asked: int, sizes: tuple[int, ...] | None, gpu_count: int) -> list[int]:
    """The world sizes a lesson allows (default: any from 2 to ``asked``) that give each rank a GPU of its own."""
    allowed = range(2, asked + 1) if sizes is None else sizes
    return [n for n in allowed if 2 <= n <= gpu_count]


def plan(asked: int, sizes: tuple[int, ...] | None = None, hardware: Hardware | None = None) -> Plan:
    """Choose the world size, backend and devices for a lesson written for ``asked`` ranks. The one place that does.

    * ``asked`` GPUs or more: ``asked`` ranks on nccl, one GPU each.
    * 2 or more GPUs, but fewer than ``asked``: nccl refuses two ranks on one GPU, so the lesson runs on the
      largest world size of ``sizes`` (default: any from 2 to ``asked``) that the GPUs allow, one rank per GPU.
    * Otherwise (no GPU, one GPU, or no size in ``sizes`` fits): ``asked`` CPU processes on gloo.

    Args:
        asked: the ranks the lesson was written for (a positive integer).
        sizes: the world sizes the lesson works at, e.g. ``(2, 4)`` when its work splits in halves or quarters.
        hardware: the machine (default: :func:`detect_hardware`).

    Returns:
        A :class:`Plan`; print its ``sentence`` and launch ``world_size`` ranks. Taught in notebook 00.

    Raises:
        ValueError: ``asked`` is not a positive integer, or too many ranks to emulate (:func:`check_world_size`).
    """
    hardware = hardware or detect_hardware()
    asked = check_count("asked", asked, unit="number of ranks")
    fitting = [asked] if hardware.on_gpus(asked) else _gpu_sizes(asked, sizes, hardware.gpu_count)
    world_size = check_world_size(max(fitting) if fitting else asked, hardware)
    devices = tuple(str(device_for(rank, hardware, world_size)) for rank in range(world_size))
    backend = hardware.backend_for(world_size)
    needs = "" if sizes is None else f"This lesson runs at {' or '.join(map(str, sizes))} ranks."
    return Plan(asked, world_size, backend, devices, _sentence(hardware, asked, world_size, needs))


def _sentence(hardware: Hardware, asked: int, world_size: int, hint: str) -> str:
    """What :func:`plan` chose, in words: how many ranks, on what, and what the timings then mean; ``hint`` ends
    the sentence when GPUs are here but not used."""
    if hardware.on_gpus(world_size):
        names = ", ".join(hardware.gpu_names[:world_size])
        if world_size == asked:
            return f"{world_size} real GPUs on the nccl backend ({names})."
        return (f"{asked} ranks asked, {hardware.gpu_count} GPUs here: running {world_size} ranks on NCCL, one GPU "
                f"each ({names}). NCCL needs a GPU of its own for each rank.")
    emulated = (f"{asked} emulated GPUs: {asked} CPU processes on the gloo backend, sharing {hardware.cpu_count} "
                "CPU core(s).")
    if hardware.emulated:
        return f"{emulated} Timings here are CPU timings, not GPU timings."
    return (f"{emulated} This machine's {hardware.gpu_count} GPU(s) are not used: nccl needs one GPU per rank, so "
            f"{asked} ranks run emulated. Results are the same; timings are CPU timings, not GPU timings. {hint}"
            ).rstrip()


def gpus_present() -> bool:
    """True when this machine has CUDA GPUs, even where ``COURSE_EMULATE=1`` keeps the ranks off them."""
    return torch.cuda.is_available()


def check_world_size(world_size: object, hardware: Hardware | None = None) -> int:
    """Validate a requested number of ranks against this machine.

    Args:
        world_size: any integer type (``int``, a numpy integer); not a bool, float or string.

    Returns:
        ``world_size`` as a plain ``int``.

    Raises:
        ValueError: ``world_size`` is not a positive integer, or is more processes than emulation can sensibly
            run. More ranks than GPUs is not refused: the ranks are emulated (see :meth:`Hardware.describe`).
    """
    hardware = hardware or detect_hardware()
    world_size = check_count("world_size", world_size, unit="number of ranks")
    if not hardware.on_gpus(world_size) and world_size > MAX_EMULATED_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} emulated GPUs would start {world_size} processes on "
            f"{hardware.cpu_count} core(s); use at most {MAX_EMULATED_WORLD_SIZE}."
        )
    return world_size


@dataclass(frozen=True)
class Rank:
    """Who this process is in a distributed job.

    Attributes:
        rank: global index of this process, 0..world_size-1.
        local_rank: index of this process on its node; picks its GPU.
        world_size: number of processes in the job.
        device: ``cuda:<local_rank>`` on GPUs, ``cpu`` when emulated.
        backend: ``nccl`` or ``gloo``.
    """

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one rank that logs and checkpoints."""
        return self.rank == 0


def device_for(local_rank: int, hardware: Hardware | None = None, local_world_size: int | None = None
               ) -> torch.device:
    """The device a rank should use: ``cuda:<local_rank>`` when each of the ``local_world_size`` ranks on this
    machine (default: ``LOCAL_WORLD_SIZE``, else one rank per GPU) has a GPU of its own, else ``cpu``."""
    hardware = hardware or detect_hardware()
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", max(1, hardware.gpu_count)))
    if not hardware.on_gpus(local_world_size):
        return torch.device("cpu")
    if hardware.device_type != "cuda":
        return torch.device(hardware.device_type)
    return torch.device("cuda", local_rank)


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={value!r} must be an integer.") from None


def init_from_env(timeout_s: float = 300.0) -> Rank:
    """Join the process group that torchrun (or :func:`course.runtime.launch.launch`) set up.

    Reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; picks the backend
    and device (a GPU per rank when there are enough, else emulated); on emulated GPUs splits the CPU cores
    between the ranks so they do not oversubscribe.

    Args:
        timeout_s: how long a collective may wait for the other ranks before failing.

    Returns:
        This process's :class:`Rank`.

    Raises:
        RuntimeError: the torchrun variables are missing (the script was run with plain ``python``).

    More ranks per node than GPUs run emulated, as CPU processes on gloo (see :meth:`Hardware.describe`).
    """
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"missing environment variables {', '.join(missing)}: this script must be started by torchrun, "
            "e.g. `torchrun --nproc_per_node=4 train.py`, or by course.runtime.launch.launch(fn, world_size=4)."
        )
    hardware = detect_hardware()
    local_rank = _env_int("LOCAL_RANK")
    world_size = _env_int("WORLD_SIZE")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device = device_for(local_rank, hardware, local_world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "cpu":
        torch.set_num_threads(max(1, hardware.cpu_count // max(1, local_world)))
    if not dist.is_initialized():
        dist.init_process_group(
            backend=hardware.backend_for(local_world), timeout=datetime.timedelta(seconds=timeout_s)
        )
    return current()


def current() -> Rank:
    """This process's :class:`Rank`; rank 0 of 1 on the default device if no process group exists."""
    hardware = detect_hardware()
    if not dist.is_initialized():
        return Rank(0, 0, 1, device_for(0, hardware, 1), hardware.backend_for(1))
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    return Rank(rank, local_rank, dist.get_world_size(), device_for(local_rank, hardware, local_world),
                dist.get_backend())


def print0(*args: object, **kwargs: object) -> None:
    """``print`` on rank 0 only, so N ranks do not print N copies of every log line."""
    if current().is_main:
        print(*args, **kwargs)


#: What :func:`shutdown` calls to drop the process groups a module keeps (registered by :func:`forget_on_shutdown`).
_FORGETTERS: list[Callable[[], None]] = []


def forget_on_shutdown(forget: Callable[[], None]) -> None:
    """Have :func:`shutdown` call ``forget`` (e.g. a cache's ``clear``) so a module's cached process groups die
    with the rest: a group still referenced after ``destroy_process_group`` keeps gloo's worker threads alive
    into interpreter shutdown (see :func:`shutdown`)."""
    _FORGETTERS.append(forget)


#: How long :func:`settle` leaves the GIL to gloo's worker threads.
SETTLE_S = 0.05


def settle(seconds: float = SETTLE_S) -> None:
    """Let gloo's worker threads finish freeing completed collectives before a model or group is torn down.

    A collective started during ``backward()`` (every DDP bucket's allreduce) holds a Python object that its
    worker thread needs the GIL to free. Destroying the process group joins those threads while holding the GIL,
    so a worker still freeing one then waits for ever (see :mod:`course.ddp.hooks`). Sleeping releases the GIL:
    a worker that finished a collective gets it and lets go. Call it after the last collective and before
    ``destroy_process_group`` or dropping a DDP model (:func:`shutdown` does).
    """
    time.sleep(seconds)


def shutdown(barrier: bool = True) -> None:
    """Leave the process group cleanly (a no-op if none was joined).

    Every process group must be freed here, while Python still runs: a group that outlives this call (held by
    a module's cache) keeps gloo's worker threads alive until the interpreter exits, and one of them can then
    free the last reference to a tensor Python owns, find the interpreter gone and abort the rank ("terminate
    called without an active exception", about 1 run in 10 of ``course.multinode.nodes``'s demo). So the caches
    registered with :func:`forget_on_shutdown` are cleared and the groups collected, which joins their threads.

    Args:
        barrier: wait for every rank first, so no rank tears down its connections while a peer still uses them
            (gloo can abort a rank at exit otherwise). Pass False after a failure, when peers may never arrive.
    """
    if dist.is_initialized():
        if barrier:
            dist.barrier()
        settle()
        dist.destroy_process_group()
    for forget in _FORGETTERS:
        forget()
    gc.collect()


#: The installed distributions ``course info`` reports, by distribution name (as pip knows them).
DISTRIBUTIONS = ("torch", "numpy", "scikit-learn", "jupyterlab", "ipywidgets", "nvidia-ml-py", "psutil")


def versions() -> dict[str, str]:
    """Versions of Python, the libraries the course needs and CUDA, and which backends this torch has.

    A library that is not installed shows as ``"not installed"`` rather than raising: ``course info`` is what
    a user runs to find out what is missing.
    """
    found = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["cuda"] = torch.version.cuda or "none (CPU build)"
    found["gloo"] = str(dist.is_gloo_available())
    found["nccl"] = str(dist.is_nccl_available())
    return found
