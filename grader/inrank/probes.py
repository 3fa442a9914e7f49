"""Trusted probes: what the student's training really did, recorded on every rank as it happens.

The harness (:mod:`grader.inrank.harness`) installs these before the student's script runs. They record, per rank
and per optimizer step: world size and backend (from the process group itself), the training-sample
indices the rank fetched and in which epoch, the learning rate, a fingerprint of the parameters before
the first step and after every step, on rank 0 a digest of every parameter tensor before and after every
step (the checkpoint must hold a state this chain of steps reached: :func:`grader.evidence.bind_checkpoint`)
and the full parameters and gradients of the first steps (the grader replays them in one process on the union
batch). They also record each collective and, per stretch between steps and reports, the ranks each
point-to-point message went to and came from, as the process group itself saw them (:mod:`course.runtime.observed`:
however the script reached them, and under NCCL's rules), every ``course.report.report`` call with the
true validation accuracy of the model at that moment, and every checkpoint written. Records leave through
:mod:`grader.inrank.channel`; the student's printed numbers are never used.

The probes also hold the data split fixed: ``data.load`` with another split seed (or other validation /
test sizes) is refused, since it would move held-out samples into training; and the test split the
student's script receives is empty (the grader evaluates the checkpoint itself, see
:mod:`grader.evaluate`). Code in the student's process could still call the probes; calls to
:meth:`Probes.emit` that do not come from this module are written as ``forgery`` records instead. In a
forked child (a DataLoader worker, a subprocess started with fork) the probes record nothing: what a child
does is not the rank's step, save or write.
"""

from __future__ import annotations

import inspect
import os
import sys
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, TensorDataset

from course import data, report
from course.runtime import intercept, observed, waits
from course.runtime.collective_names import FUNCTIONS, functions
from course.runtime.observed_record import Record
from grader.inrank import probed_data, records
from grader.inrank.channel import Writer
from grader.inrank.fingerprints import digests, encode, fingerprint, full_tensors, has_shards, projection

COLLECTIVES = functions(kind="collective")  # heard by name on a group of torch's own (nccl on GPUs)
FULL_STEPS = 2  # steps whose parameters and gradients rank 0 records in full, for the replay
HERE = os.path.abspath(__file__)
TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class Probes:
    """Everything recorded on one rank. ``install()`` once, before the student's code is imported."""

    def __init__(self, writer: Writer, rank: int, seed: int, run_dir: str | None = None) -> None:
        self.writer, self.rank, self.seed = writer, rank, seed
        self.run_dir = os.path.realpath(run_dir if run_dir is not None else os.getcwd())  # fixed at start-up
        self.silent = False  # True in a forked child (DataLoader worker, ...): only the rank itself records
        self.batches = probed_data.TrainedBatches()  # fetched since the last optimizer step, and trained on
        self.epoch = -1  # how many times a loader over the training split has been iterated, less one
        self._consumed_epoch = (0, set())  # without such a loader: epochs told by a sample consumed again
        self.steps = 0
        self._pending_grads: list[torch.Tensor] | None = None
        self._pending_full: dict[str, Any] = {}  # rank 0's full parameters before one of the first steps
        self._algorithm = ""  # class of the innermost optimizer stepped in the current step
        self._depth = 0  # optimizer steps under way: a wrapping optimizer's (ZeRO's) step runs its inner one's
        self._last: list[torch.Tensor] = []  # rank 0: the whole parameters after the last step
        self._broken: set[str] = set()  # probes that failed (the grader's error): they record no more
        self._optimizer: weakref.ref | None = None
        self._projection: torch.Tensor | None = None
        self._originals: dict[str, Any] = {}
        self._wrappers: dict[str, Any] = {}
        self._tampered: set[str] = set()
        self._distributed: dict[str, Any] = {}
        self._val: TensorDataset | None = None
        self._init_seen = False
        self._sent_to: set[int] = set()  # peers of the point-to-point messages since the last ``messages`` record
        self._received_from: set[int] = set()

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one record (:mod:`grader.inrank.records` declares each kind's fields); from outside this module, a
        ``forgery`` record naming the caller instead."""
        if self.silent:
            return
        caller = sys._getframe(1).f_code.co_filename
        if os.path.abspath(caller) != HERE:
            fields, kind = {"via": "Probes.emit", "caller": caller, "forged_kind": str(kind)}, "forgery"
        self.writer.write(records.make(kind, rank=self.rank, **fields).to_dict())

    def finish(self, how: str, exit_code: int, error: str | None) -> None:
        """The ``end`` record: how the script ended (the harness calls this once, after the script); on rank 0
        also the :func:`digests` of the parameters its optimizer holds now, so the grader can tell whether
        they changed after the last recorded step."""
        optimizer = self._optimizer() if self._optimizer else None
        params = self._parameters(optimizer) if self.rank == 0 and optimizer is not None else []
        final = digests(params) if params and not has_shards(params) else None  # shards: no gather on one rank
        self._joined()
        self._flush_messages()
        self.emit("end", how=how, exit_code=exit_code, steps=self.steps, error=error, digests=final)

    # ----------------------------------------------------------------------------------------- install
    def install(self) -> None:
        """Wrap the data loader, optimizers, process group, collectives, report and torch.save."""
        self._wrap_data()
        self._wrap_loader_iter()
        register_optimizer_step_pre_hook(self._guard("optimizer step", self._before_step))
        register_optimizer_step_post_hook(self._guard("optimizer step", self._after_step))
        torch.nn.modules.module.register_module_forward_pre_hook(self._guard("forward", self.batches.forward))
        intercept.INTERCEPTOR.add(self._guard("torch.distributed", self._listen),
                                  ("init_process_group", "destroy_process_group", *COLLECTIVES, *intercept.MESSAGES))
        observed.install()  # every gloo group the script makes records its calls and keeps NCCL's rules
        observed.add_listener(self._guard("communication", self._observe))
        waits.Recorder(self._guard("point-to-point waits", self._wait)).start()
        self._wrap(report, "report", self._report)
        self._wrap(torch, "save", self._save)
        for name in ("spawn", "start_processes"):
            self._wrap(torch.multiprocessing, name, self._noted(f"torch.multiprocessing.{name}", nprocs_at=2))
        self._wrap(torch, "compile", self._noted("torch.compile"))
        torch.serialization.save = torch.save
        sys.addaudithook(self._audit)
        self.silence_in_children()
        # what the script sees as torch.distributed's functions: one it replaces (a no-op all_reduce) is tampering
        self._distributed = {name: getattr(dist, name) for name in FUNCTIONS if hasattr(dist, name)}

    def silence_in_children(self) -> None:
        """From now on, a process forked from this one records nothing. What a child does (a DataLoader
        worker, a subprocess) is not a step, save or write of the rank's (the rank itself records the batches
        its workers load), and its records would take the rank's sequence numbers."""
        os.register_at_fork(after_in_child=self._silence)

    def _silence(self) -> None:
        self.silent = True

    def _guard(self, where: str, probe: Any) -> Any:
        """``probe`` made safe for the student's process: should the grader's own code fail, it is written as
        a ``probe_error`` record (the grader's error, reported as such) and on the rank's error output, that
        probe records nothing more, and the student's script goes on as if the probe were not there. It returns
        what ``probe`` returns (None once failed)."""
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if where in self._broken:
                return None
            try:
                return probe(*args, **kwargs)
            except Exception as error:  # noqa: BLE001  (any failure of the grader's code is the grader's)
                self._broken.add(where)
                text = f"{type(error).__name__}: {error}"[:500]
                print(f"[grader error, not the submission's] the grader's {where} probe failed: {text}",
                      file=sys.stderr, flush=True)
                self.emit("probe_error", where=where, error=text)
                return None
        return guarded

    def _wrap(self, module: Any, name: str, make: Any) -> None:
        original = getattr(module, name)
        self._originals[f"{module.__name__}.{name}"] = original
        wrapper = make(original)
        self._wrappers[f"{module.__name__}.{name}"] = wrapper
        setattr(module, name, wrapper)

    def _wrap_data(self) -> None:
        probes = self

        def make(original):
            signature = inspect.signature(original)

            def load(*args, **kwargs):
                probed_data.refuse_other_splits(original.__name__, signature.bind(*args, **kwargs).arguments)
                splits = original(*args, **kwargs)
                probes._val = splits.val
                if probes.batches.catalogue is None:  # names the samples the model consumes, however batched
                    probes.batches.catalogue = probed_data.Catalogue(splits.train.tensors[0])
                hidden = TensorDataset(splits.test.tensors[0][:0], splits.test.tensors[1][:0])
                return data.Splits(probed_data.ProbedDataset(splits.train), splits.val, hidden,
                                   splits.num_classes, splits.name)
            return load

        self._wrap(data, "load", make)
        self._wrap(data, "load_digits", make)

    def _wrap_loader_iter(self) -> None:
        original, probes = DataLoader.__iter__, self

        def __iter__(loader):
            if not isinstance(loader.dataset, probed_data.ProbedDataset):
                return original(loader)
            probes.epoch += 1
            return probed_data.record_batches(loader, original, probes.batches)

        DataLoader.__iter__ = __iter__

    def _listen(self, call: intercept.Call) -> intercept.After | None:
        """The probes' listener on torch.distributed (:mod:`course.runtime.intercept`): the process group joined
        and left; and, on a group of torch's own (nccl on GPUs, which is not observed), the collectives called by
        name and the messages (an observed group's are heard from the group itself: :meth:`_observe`)."""
        if call.name in intercept.MESSAGES:
            if not _observed(call.args[0] if call.args else None):
                self._message(call)
            return None
        if call.nested:
            return None
        if call.name == "init_process_group":
            return self._after_init
        if call.name == "destroy_process_group":
            self._joined()
            self.emit("shutdown", steps=self.steps)
        elif call.name in COLLECTIVES and dist.is_initialized() and not observed.is_observed():
            self._joined()
            self.emit("collective", op=call.name, step=self.steps, by_torch=call.caller.startswith(TORCH))
        return None

    def _message(self, call: intercept.Call) -> None:
        """Tally one message of a group of torch's own (``ProcessGroup.send(tensors, peer, tag)`` or ``recv``) by
        its peer's rank in the default group; :meth:`_flush_messages` writes the tally."""
        group, peer = (call.args[0], call.args[2]) if len(call.args) > 2 else (None, None)
        if not isinstance(peer, int) or self.silent:
            return
        try:
            peer = dist.get_global_rank(group, peer) if group is not None and group != dist.group.WORLD else peer
        except (RuntimeError, ValueError):
            pass  # a group the default one does not know: its own rank numbers
        tally = self._sent_to if call.name == "ProcessGroup.send" else self._received_from
        tally.add(peer)

    def _observe(self, record: Record) -> None:
        """Every collective (before it runs: a rank hung in one shows it) and message the rank issued, as its
        process group saw it (:mod:`course.runtime.observed`): however the script reached it. A collective is named
        as the script called it (``all_gather_single``), or by its operation when torch's code called the group."""
        if record.kind == "p2p":
            if record.peer is not None and not self.silent:
                (self._sent_to if record.op == "send" else self._received_from).add(record.peer)
            return
        self._joined()
        op = record.api if record.api in FUNCTIONS else record.op
        self.emit("collective", op=op, step=self.steps, by_torch=record.by_torch)  # seq: the record number

    def _wait(self, record: waits.Record, change: str) -> None:
        """A ``wait`` record as the rank begins to wait for point-to-point messages (:mod:`course.runtime.waits`,
        the record launch's ranks keep too): a rank hung on one shows whom it waits for, as one hung in a collective
        shows the collective."""
        if change == "waits":
            self.emit("wait", step=self.steps, messages=record.to_dict())

    def _after_init(self, result: Any) -> Any:
        self._guard("torch.distributed", self._joined)()
        return result

    def _joined(self) -> None:
        """The ``init`` record, once, as soon as the probes see a process group: however it was made
        (``dist.init_process_group``, ``init_device_mesh``, a ``new_group`` or a store of the script's own)."""
        if self._init_seen or self.silent or not dist.is_initialized():
            return
        self._init_seen = True
        self.emit("init", backend=_backend(), world_size=dist.get_world_size(),
                  group_rank=dist.get_rank(), pid=os.getpid(),
                  local_rank=_int_or_none(os.environ.get("LOCAL_RANK")))

    def _flush_messages(self) -> None:
        """The ``messages`` record of the messages since the last one, if any."""
        if self._sent_to or self._received_from:
            sent, received = sorted(self._sent_to), sorted(self._received_from)
            self._sent_to, self._received_from = set(), set()
            self.emit("messages", step=self.steps, sent_to=sent, received_from=received)

    # ----------------------------------------------------------------------------------------- steps
    def _parameters(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _fingerprint(self, params: list[torch.Tensor]) -> list[float]:
        numel = sum(p.numel() for p in params)
        if self._projection is None or self._projection.shape[1] != numel:  # drawn once, reused every step
            self._projection = projection(numel, self.seed)
        return fingerprint(params, self.seed, self._projection)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Before the outermost optimizer's step (a wrapping or sharded optimizer, ZeroRedundancyOptimizer,
        steps an inner one on its shard: the step is the outer one's, on every parameter). Sharded parameters
        and gradients (DTensors) are gathered whole on every rank."""
        self._depth += 1
        self._joined()
        self._algorithm = type(optimizer).__name__  # the innermost optimizer's: the update rule (Adam, ...)
        if self._depth > 1:
            return
        local = self._parameters(optimizer)
        self._pending_grads = [g.detach().clone() for g in full_tensors(
            [p.grad if p.grad is not None else torch.zeros_like(p) for p in local])]
        params = full_tensors(local)
        if self.steps == 0:
            self.emit("initial", fingerprint=self._fingerprint(params), device=str(params[0].device))
        if self.rank == 0 and self.steps < FULL_STEPS:
            self._pending_full = {"params_before": encode(params),
                                  "shapes": [list(p.shape) for p in params]}
        else:
            self._pending_full = {}
        if self.rank == 0:  # equal to the last step's "digests" unless something else changed the parameters
            self._pending_full["digests_before"] = digests(params)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._depth -= 1
        if self._depth > 0 or self._pending_grads is None:  # an inner optimizer's step: the outer one counts
            return
        grads, self._pending_grads = self._pending_grads, None
        self._flush_messages()  # those of this step's backward and before: tagged with the steps taken before it
        self.steps += 1
        self._optimizer = weakref.ref(optimizer)
        params = full_tensors(self._parameters(optimizer))
        indices, precision = self.batches.take()
        fields: dict[str, Any] = {
            "step": self.steps, "epoch": self._epoch_of(indices), "indices": indices, "precision": precision,
            "lr": [float(g.get("lr", float("nan"))) for g in optimizer.param_groups],
            "optimizer": self._algorithm, "fingerprint": self._fingerprint(params),
            "world_size": dist.get_world_size() if dist.is_initialized() else None,
            "backend": _backend() if dist.is_initialized() else None,
        }
        if self.rank == 0:  # what the grader will require of the checkpoint: bound to the training seen here
            fields["digests"] = digests(params)
            self._last = params
        if "params_before" in self._pending_full:
            fields.update(grads=encode(grads), hyper=_hyperparameters(optimizer))
        fields.update(self._pending_full)
        self.emit("step", **fields)
        self._check_tampering()

    def _epoch_of(self, indices: list[int]) -> int:
        """The epoch of a step: the DataLoader's over the training split, else (a dataset indexed by hand, a
        pre-sharded tensor) counted from what the model consumed: an epoch ends when a sample comes again."""
        if self.epoch >= 0:
            return self.epoch
        epoch, seen = self._consumed_epoch
        if seen.intersection(indices):
            epoch, seen = epoch + 1, set()
        seen.update(indices)
        self._consumed_epoch = (epoch, seen)
        return epoch

    def _check_tampering(self) -> None:
        replaced = [key for key, wrapper in self._wrappers.items()
                    if getattr(sys.modules[key.rsplit(".", 1)[0]], key.rsplit(".", 1)[1], None) is not wrapper]
        replaced += [f"torch.distributed.{name}" for name, function in self._distributed.items()
                     if getattr(dist, name, None) is not function]
        for key in dict.fromkeys(replaced + intercept.INTERCEPTOR.replaced()):
            if key not in self._tampered:
                self._tampered.add(key)
                self.emit("tamper", name=key, step=self.steps)

    # ----------------------------------------------------------------------------------------- report, files
    def _report(self, original):
        def report(epoch, train_loss, val_accuracy):
            self._joined()
            self._flush_messages()  # those that combined the reported numbers come before the report
            self.emit("report", epoch=_number(epoch), train_loss=_number(train_loss),
                      val_accuracy=_number(val_accuracy), true_val_accuracy=self._true_val_accuracy(),
                      step=self.steps)
            return original(epoch, train_loss, val_accuracy)
        return report

    def _true_val_accuracy(self) -> float | None:
        """Of the parameters rank 0's optimizer left after its last step (whole, even when sharded)."""
        return probed_data.true_val_accuracy(self._last, self._val) if self._last else None

    def _save(self, original):
        def save(obj, f, *args, **kwargs):
            path = _file_path(f)
            if path is not None:  # a torch.save into memory (io.BytesIO: ZeRO's consolidate_state_dict) writes no file
                self.emit("save", path=path, step=self.steps)
            return original(obj, f, *args, **kwargs)
        return save

    def _noted(self, function: str, nprocs_at: int | None = None):
        """A wrapper maker writing a ``call`` record of ``function`` (with its ``nprocs`` argument, positional
        at ``nprocs_at``), for the feedback to name."""
        def make(original):
            def noted(*args, **kwargs):
                if sys._getframe(1).f_code.co_filename.startswith(TORCH):  # torch's own use, not the script's
                    return original(*args, **kwargs)
                nprocs = None
                if nprocs_at is not None:
                    nprocs = kwargs.get("nprocs", args[nprocs_at] if len(args) > nprocs_at else 1)
                self.emit("call", function=function, step=self.steps,
                          nprocs=nprocs if isinstance(nprocs, int) else None)
                return original(*args, **kwargs)
            return noted
        return make

    def _audit(self, event: str, args: tuple) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
        if writing and not self.silent:
            path = os.path.abspath(os.fsdecode(args[0]))
            if _inside(path, self.run_dir) or _inside(os.path.realpath(path), self.run_dir):
                self.emit("write", path=path, step=self.steps)


def _observed(group: Any) -> bool:
    """``group`` is an observed group or the real group inside one (whose messages are an observed group's)."""
    return observed.is_observed(group) or observed.outer(group) is not group


def _backend() -> str:
    """The backend of the default process group for this rank's devices: ``gloo`` on CPUs, ``nccl`` on GPUs. A group
    made without naming one (``init_device_mesh``, ``init_process_group()``) has one per device type
    (``cpu:gloo,cuda:nccl``): the one for the GPU if there is one, else the CPU's."""
    name = str(dist.get_backend())
    if ":" not in name and name != "undefined":
        return name
    config = str(dist.get_backend_config())
    by_device = dict(part.split(":", 1) for part in config.split(",") if ":" in part)
    return by_device.get("cuda" if torch.cuda.is_available() else "cpu", name)


def _file_path(f: Any) -> str | None:
    """The absolute path of the file ``torch.save(obj, f)`` writes: ``f`` itself, or an open file's name; None
    for an in-memory buffer."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) else None


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies under it (``/run2/x`` does not lie under ``/run``; ``/`` holds all)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _hyperparameters(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The first param group's JSON-able settings (lr, betas, eps, momentum, ...)."""
    out = {}
    for key, value in optimizer.param_groups[0].items():
        if key == "params":
            continue
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
        elif isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value):
            out[key] = list(value)
    return out


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
