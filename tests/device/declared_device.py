"""Run a rank function as if its rank's device were a GPU, on a machine with none, and catch tensors left behind.

On a GPU node ``course.world`` gives each rank ``cuda:<local_rank>`` and the ``nccl`` backend, which refuses a CPU
tensor; an operation mixing a CPU tensor with a CUDA one fails too. Neither happens on the CPU-only machines the
tests run on, where every rank's device is the CPU. So here a rank *declares* another device, ``meta`` (tensors
with a shape and no data), through ``course.world``'s hardware description (:attr:`course.world.Hardware.device_type`):

* every rank runs in this process, one after the other, on torch's fake process group (collectives return at once);
* every ``torch.distributed`` collective and point-to-point call first checks that each tensor it is given is on
  the rank's declared device, and raises :class:`WrongDevice` naming the call and the device otherwise;
* an operation mixing a CPU tensor with a meta one raises torch's own "not on the expected device";
* reading a meta tensor's value (``item``, ``float``, ``tolist``, ``bool``) or copying it to the CPU (``cpu()``,
  ``to("cpu")``, ``copy_``) gives ones instead of failing, so the code after it still runs (its numbers mean
  nothing: only where tensors live is checked); ``torch.equal``/``allclose`` compare meta tensors as ones and
  refuse two devices, as on a GPU;
* the ranks share one key-value store (:class:`SharedStore`); a rank reading a key a later rank writes makes every
  rank run again on the filled store (:func:`run_ranks`).

:func:`run_ranks` returns an :class:`Outcome` per rank: the device error if one was found, else how far the rank got.

DDP is checked through a communication hook registered at its construction (each gradient bucket must be on the
device; a hook the code registers later runs inside it) and through its parameter check. Limits: torch's meta
kernels let a few operations mix devices (``F.linear`` of a CPU input, indexing with a meta index), so such a
tensor is caught only when it reaches a collective; the object collectives (``all_gather_object``, ...) are
not checked (they pick their device from the backend); code that needs real values (autocast, an FSDP mesh, a
shape sent as a tensor) stops early, and ``Outcome.stopped`` says where.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.testing._internal.distributed import fake_pg  # noqa: F401 - registers the "fake" backend

from course import world

DECLARED = torch.device("meta")
#: torch.distributed's calls that move tensors between ranks: each tensor they get must be on the rank's device
CALLS = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_coalesced",
         "all_gather_into_tensor", "all_gather_single", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor",
         "reduce_scatter_single", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
         "batch_isend_irecv", "_all_gather_base", "_reduce_scatter_base")
#: torch.distributed's other functions, and why they are not checked (``test_declared_device`` asks that every
#: function torch.distributed exports be in :data:`CALLS`, :data:`OBJECT_CALLS` or here)
NOT_CHECKED = {
    "barrier": "moves no tensor of the caller's", "monitored_barrier": "moves no tensor of the caller's",
    **dict.fromkeys(("init_process_group", "destroy_process_group", "new_group", "new_subgroups",
                     "new_subgroups_by_enumeration", "split_group", "shrink_group"), "makes or ends a process group"),
    **dict.fromkeys(("get_backend", "get_backend_config", "get_default_backend_for_device", "get_global_rank",
                     "get_group_rank", "get_node_local_rank", "get_pg_count", "get_process_group_ranks", "get_rank",
                     "get_world_size", "is_backend_available", "is_gloo_available", "is_initialized",
                     "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "is_ucc_available",
                     "is_xccl_available", "supports_complex"), "answers a question, takes no tensor"),
    "record_comm": "names the collectives inside it for the profiler, takes no tensor",
}
#: torch's words when an operation gets tensors on two devices
MIXED_DEVICES = ("not on the expected device", "Expected all tensors to be on the same device",
                 "found at least two devices")


class WrongDevice(RuntimeError):
    """A tensor given to a collective is not on the rank's device (nccl would refuse it)."""


@dataclass
class Outcome:
    """How one rank's run ended: ``device_error`` says what was on the wrong device; ``stopped`` any other error."""

    rank: int
    result: Any = None
    device_error: str = ""
    stopped: str = ""


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dist.P2POp):
        yield value.tensor


#: torch's object collectives pickle into tensors on the device the backend wants (nccl: the current GPU; here,
#: the fake group's CPU): the calls they make inside are not checked
OBJECT_CALLS = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                "send_object_list", "recv_object_list")
_INSIDE = threading.local()


def _trusted(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            _INSIDE.depth -= 1

    return call


def _checked(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_INSIDE, "depth", 0):
            return original(*args, **kwargs)
        for tensor in _tensors(list(args) + list(kwargs.values())):
            if tensor.device != DECLARED:
                raise WrongDevice(f"rank {dist.get_rank()} passed {name} a {tuple(tensor.shape)} tensor on "
                                  f"{tensor.device}, but its device is {DECLARED} (standing in for "
                                  f"cuda:{dist.get_rank()}): nccl refuses it. Create it on world.current().device.")
        work = original(*args, **kwargs)
        if isinstance(work, list):  # batch_isend_irecv: a request per operation
            return [_Done([]) for _ in work]
        return _Done(list(_tensors(args[:1]))) if work is not None else None

    return call


class _Done:
    """The finished request an ``async_op`` call returns: its future holds the tensors, as gloo's and nccl's do
    (the fake process group's holds nothing, which DDP's communication hooks cannot use)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self.tensors)
        return future


def _bucket_hook(ddp, bucket):  # noqa: ANN001, ANN202 - DDP refuses string annotations
    """DDP's communication, checked: each gradient bucket must be on the rank's device; then the hook the code
    registered (``register_comm_hook``) runs, or the bucket is handed back as it is (the fake group sums nothing)."""
    buffer = bucket.buffer()
    if buffer.device != DECLARED:
        raise WrongDevice(f"rank {dist.get_rank()}'s DDP bucket of {buffer.numel()} gradients is on {buffer.device}, "
                          f"but its device is {DECLARED}: move the model to world.current().device first.")
    state, hook = getattr(ddp, "_declared_hook", (None, None))
    if hook is not None:
        return hook(state, bucket)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


class _KeptBuckets:
    """DDP's reducer, except that it keeps its first buckets: rebuilding them reads meta values (their order)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _ddp_patches() -> list[Any]:
    """DDP's constructor registers :func:`_bucket_hook`; a hook registered later by the code runs inside it."""
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N814

    init, register = DDP.__init__, DDP.register_comm_hook

    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        register(self, self, _bucket_hook)
        self.reducer = _KeptBuckets(self.reducer)

    def remember(self: Any, state: object, hook: Callable[..., Any]) -> None:
        self._declared_hook = (state, hook)

    return [mock.patch.object(DDP, "__init__", checked_init), mock.patch.object(DDP, "register_comm_hook", remember),
            mock.patch("torch.nn.parallel.distributed._verify_param_shape_across_processes",
                       _parameters_on_the_device)]


def _ones(tensor: torch.Tensor) -> torch.Tensor:
    return torch.ones(tensor.shape, dtype=tensor.dtype)


def _reads() -> dict[str, Callable[..., Any]]:
    """Tensor methods that read a value, answering ones for a meta tensor."""
    base = torch._C.TensorBase

    def read(name: str) -> Callable[..., Any]:
        original = getattr(base, name)

        def method(self: torch.Tensor, *args: Any) -> Any:
            return original(_ones(self) if self.is_meta else self, *args)

        return method

    reads = {name: read(name) for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__",
                                           "numpy", "cpu")}
    to, copy = base.to, base.copy_

    def to_device(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.is_meta and _target(args, kwargs) not in (None, DECLARED):  # off the rank's device: ones
            return to(_ones(self), *args, **kwargs)
        return to(self, *args, **kwargs)

    def copy_in(self: torch.Tensor, source: torch.Tensor, *args: Any) -> torch.Tensor:
        return copy(self, _ones(source) if source.is_meta and not self.is_meta else source, *args)

    return {**reads, "to": to_device, "copy_": copy_in}


def _compare(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.equal``/``allclose`` (which read values): tensors on two devices fail as on a GPU; meta ones
    compare as ones."""
    @functools.wraps(original)
    def compare(first: torch.Tensor, second: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and (first.is_meta or second.is_meta):
            if first.device != second.device:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"{first.device} and {second.device} ({original.__name__})")
            return original(_ones(first), _ones(second), *args, **kwargs)
        return original(first, second, *args, **kwargs)

    return compare


#: functions that compare two tensors' values, as ``torch``'s and as methods
COMPARES = ("equal", "allclose")


def _target(args: tuple, kwargs: dict) -> torch.device | None:
    """The device a ``Tensor.to`` call moves to, if it names one."""
    for value in (*args, kwargs.get("device")):
        if isinstance(value, (str, torch.device)):
            return torch.device(value)
        if isinstance(value, torch.Tensor):
            return value.device
    return None


@contextlib.contextmanager
def declared(gpus: int) -> Iterator[None]:
    """While open: ``course.world`` declares ``gpus`` GPUs whose device type is ``meta`` (0: a machine with none);
    collectives check their tensors' device; meta values read as ones."""
    hardware = world.Hardware(gpu_names=("declared meta device",) * gpus, cpu_count=1, device_type="meta")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(world, "detect_hardware", lambda: hardware))
        for name in CALLS + OBJECT_CALLS:
            if hasattr(c10d, name):
                wrapper = (_trusted if name in OBJECT_CALLS else functools.partial(_checked, name))(getattr(c10d, name))
                stack.enter_context(mock.patch.object(c10d, name, wrapper))
                if hasattr(dist, name):
                    stack.enter_context(mock.patch.object(dist, name, wrapper))
        for patch in _ddp_patches():
            stack.enter_context(patch)
        for name, method in _reads().items():
            stack.enter_context(mock.patch.object(torch.Tensor, name, method))
        for name in COMPARES:
            stack.enter_context(mock.patch.object(torch, name, _compare(getattr(torch, name))))
            stack.enter_context(mock.patch.object(torch.Tensor, name, _compare(getattr(torch.Tensor, name))))
        yield


def _where(error: BaseException) -> str:
    """The innermost line of the course's (or a solution's) code the error passed through."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "site-packages" not in f.filename and "declared_device" not in f.filename]
    return f" (at {os.path.relpath(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def _parameters_on_the_device(process_group: object, parameters: list[torch.Tensor], logger: object = None) -> None:
    """DDP's check that every rank has the same parameters (which reads values): here, that they are on the device."""
    for parameter in parameters:
        if parameter.device != DECLARED:
            raise WrongDevice(f"rank {dist.get_rank()} wrapped a model with parameters on {parameter.device} in DDP, "
                              f"but its device is {DECLARED}: move the model to world.current().device first.")


def _classify(error: BaseException) -> tuple[str, str]:
    text = f"{type(error).__name__}: {error}{_where(error)}"
    if isinstance(error, WrongDevice) or any(words in str(error) for words in MIXED_DEVICES):
        return text, ""
    return "", text


class NotWrittenYet(LookupError):
    """A rank read a store key that a rank which has not run yet writes (the ranks run one after the other)."""


class SharedStore(dist.Store):
    """The process group's key-value store, shared by the ranks and kept between passes (see :func:`run_ranks`).

    Reading a key no rank has written raises :class:`NotWrittenYet` (a real store would wait for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.values[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        if key not in self.values:
            raise NotWrittenYet(key)
        return self.values[key]

    def add(self, key: str, amount: int) -> int:
        total = int(self.values.get(key, b"0")) + amount
        self.values[key] = str(total).encode()
        return total

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def delete_key(self, key: str) -> bool:
        return self.values.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.values)

    def wait(self, keys: list[str], timeout: object = None) -> None:
        for key in keys:
            self.get(key)

    def set_timeout(self, timeout: object) -> None:
        pass


def _waits_for_a_later_rank(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, NotWrittenYet) or "NotWrittenYet" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, gpus: int | None = None,
              **kwargs: Any) -> list[Outcome]:
    """Call ``fn(*args, **kwargs)`` as each of ``world_size`` ranks in turn, with the declared device (see the module
    doc); ``fn`` sees ``world.current().device == meta`` and a process group of ``world_size``, on a machine that
    declares ``gpus`` GPUs (default: ``world_size``, one per rank).

    The ranks share one store. A rank that reads a key a later rank writes (rank 0 waiting for rank 3's message
    size, say) stops; then every rank runs again, on the store the last pass filled, until none stops so or a pass
    writes no new key (each pass lets such ranks get further, so a ring of n ranks takes about n passes)."""
    store = SharedStore()
    while True:
        written = set(store.values)
        outcomes, waiting = _pass(store, fn, world_size, world_size if gpus is None else gpus, args, kwargs)
        if not waiting or set(store.values) == written:
            return outcomes


def _pass(store: SharedStore, fn: Callable[..., Any], world_size: int, gpus: int, args: tuple,
          kwargs: dict) -> tuple[list[Outcome], bool]:
    """One run of every rank in turn: the outcomes, and whether a rank stopped on a key a later rank writes."""
    outcomes, waiting = [], False
    environment = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": str(world_size),
                   "LOCAL_WORLD_SIZE": str(world_size)}
    with declared(gpus):
        for rank in range(world_size):
            outcome = Outcome(rank)
            with mock.patch.dict(os.environ, {**environment, "RANK": str(rank), "LOCAL_RANK": str(rank)}):
                dist.init_process_group("cpu:fake,meta:fake", store=store, rank=rank, world_size=world_size)
                try:
                    outcome.result = fn(*args, **kwargs)
                except Exception as error:  # noqa: BLE001 - classified: a device error or where the run stopped
                    outcome.device_error, outcome.stopped = _classify(error)
                    waiting = waiting or _waits_for_a_later_rank(error)
                finally:
                    world.shutdown(barrier=False)
            outcomes.append(outcome)
    return outcomes, waiting


def device_errors(outcomes: list[Outcome]) -> list[str]:
    """``"rank 1: WrongDevice: ..."`` for every rank that put a tensor on the wrong device."""
    return [f"rank {o.rank}: {o.device_error}" for o in outcomes if o.device_error]
