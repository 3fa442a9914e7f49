"""Lab "checkpoint": the student saves and loads a full checkpoint under DDP, and a stopped run resumes bit-for-bit.

The student's ``labs/checkpoint_resume.py`` (stub: ``grader/labs/checkpoint/stub.py``, taught in
``notebooks/09_real_gpu_practice.ipynb``) defines ``save_checkpoint(path, model, optimizer, scheduler, epoch,
step)`` (called on every rank; rank 0 writes) and ``load_checkpoint(path, model, optimizer, scheduler)`` (every
rank; returns ``(epoch, step)``). On every rank :func:`check_on_rank` trains a small MLP with dropout under DDP
(SGD with momentum, a StepLR schedule, ``DistributedSampler`` batches) twice: once without a stop, once stopped
after ``stop_at`` steps, saved, "restarted" (a new model with other weights, a new optimizer and scheduler, the
random number generators reseeded) and loaded. ``torch.save`` is watched while the student's save runs; on rank
0 it waits (up to :data:`WRITE_DELAY_S`) until rank 1 has returned from its own save, so a missing barrier is
seen every time, not by luck. Checks:

* ``training_state``: after loading, every rank's parameters, optimizer state (momentum) and scheduler equal
  what they were when saved;
* ``rng_and_position``: every rank's random number generators (torch's, Python's ``random``, numpy's) are its
  own states at the save, and the returned ``(epoch, step)`` is where the run stopped;
* ``one_writer``: only rank 0 calls ``torch.save``, and the file is complete when ``save_checkpoint`` returns on
  every rank (a barrier);
* ``atomic``: rank 0 writes another file and renames it to ``path`` (``os.replace``), so a crash in the middle of
  the write leaves the previous checkpoint whole;
* ``bit_for_bit``: the resumed run's final parameters equal the uninterrupted run's exactly.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import world
from course.practice.checkpoint import epoch_batches
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry

#: Not to be used by the student: the course's own checkpoint does what the lab asks.
SHORTCUTS = ("course.practice.checkpoint:save", "course.practice.checkpoint:load",
             "course.practice.checkpoint:rng_states", "course.practice.checkpoint:set_rng_states")
#: How long rank 0's torch.save waits for rank 1 to return from save_checkpoint (it returns at once without a
#: barrier; with one it never does before rank 0 has written, and rank 0 writes after this delay).
WRITE_DELAY_S = 3.0
NUM_SAMPLES, FEATURES, CLASSES, BATCH_SIZE, LR = 64, 16, 4, 8, 0.1

CHECKS = (
    Check("training_state", "after loading, model, optimizer and scheduler are as they were saved", 3),
    Check("rng_and_position", "after loading, each rank's random numbers and the data position are restored", 3),
    Check("one_writer", "rank 0 alone writes the file, complete when save returns on every rank", 2),
    Check("atomic", "the file is written elsewhere, then renamed into place (a crash mid-write loses nothing)", 1),
    Check("bit_for_bit", "a run stopped and resumed ends with the uninterrupted run's parameters, bit for bit", 2),
)


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(NUM_SAMPLES, FEATURES, generator=generator),
            torch.randint(0, CLASSES, (NUM_SAMPLES,), generator=generator))


def _build(init_seed: int, me: world.Rank) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, CLASSES))
    ddp = DistributedDataParallel(model.to(me.device))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    return ddp, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)


def _flat(tensors: Any) -> torch.Tensor:
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    return torch.cat([t.detach().reshape(-1).cpu().double() for t in tensors]) if tensors else torch.zeros(0)


def _cuda_rng(me: world.Rank) -> torch.Tensor | None:
    """This rank's CUDA generator (dropout on a GPU draws from it), None on the CPU."""
    return torch.cuda.get_rng_state(me.device) if me.device.type == "cuda" else None


def _momentum(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    return _flat(state.get("momentum_buffer") for state in optimizer.state.values())


class _WatchedSave:
    """``torch.save`` replaced while the checker runs: counts the calls to a file made inside the student's save,
    and on rank 0 waits for rank 1's signal (or :data:`WRITE_DELAY_S`) before writing."""

    def __init__(self, signal: str, rank: int) -> None:
        self.original, self.signal, self.rank = torch.save, signal, rank
        self.calls, self.watching, self.targets = 0, False, []

    def __call__(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if self.watching and isinstance(f, (str, os.PathLike)):  # all_gather_object saves to memory: not counted
            self.calls += 1
            self.targets.append(os.path.abspath(os.fspath(f)))
            if self.rank == 0:
                deadline = time.monotonic() + WRITE_DELAY_S
                while not os.path.exists(self.signal) and time.monotonic() < deadline:
                    time.sleep(0.02)
        return self.original(obj, f, *args, **kwargs)


def train(config: dict, me: world.Rank, save: Any = None, load: Any = None, path: str = "",
          watch: _WatchedSave | None = None) -> tuple[torch.Tensor, dict]:
    """Train ``config["epochs"]``; with ``save``/``load``, stop after ``stop_at`` steps, save, restart, load.

    Returns the final parameters and what was measured around the stop."""
    seed, steps_per_epoch = config["seed"], NUM_SAMPLES // (BATCH_SIZE * me.world_size)
    inputs, targets = _data(seed)
    model, optimizer, scheduler = _build(seed, me)
    torch.manual_seed(seed + 1 + me.rank)  # each rank its own dropout masks
    measured: dict = {}
    epoch, begin = 0, 0
    while epoch < config["epochs"]:
        for step, batch in enumerate(epoch_batches(NUM_SAMPLES, BATCH_SIZE, epoch, begin, seed), start=begin):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs[batch].to(me.device)), targets[batch].to(me.device)).backward()
            optimizer.step()
            scheduler.step()
            if save is not None and not measured and epoch * steps_per_epoch + step + 1 == config["stop_at"]:
                position = divmod(config["stop_at"], steps_per_epoch)
                measured = _stop_and_resume(config, me, (model, optimizer, scheduler), save, load, path, watch,
                                            position)
                model, optimizer, scheduler = measured.pop("resumed")
                epoch, begin = measured["loaded_position"]
                break
        else:
            epoch, begin = epoch + 1, 0
    return _flat(model.parameters()), measured


def _stop_and_resume(config: dict, me: world.Rank, training: tuple, save: Any, load: Any, path: str,
                     watch: _WatchedSave, position: tuple[int, int]) -> dict:
    """Save, then build everything anew as a restarted job would, load, and measure what came back."""
    model, optimizer, scheduler = training
    saved = {"params": _flat(model.parameters()), "momentum": _momentum(optimizer),
             "scheduler": dict(scheduler.state_dict()), "rng": torch.get_rng_state(), "python_rng": random.getstate(),
             "numpy_rng": np.random.get_state(), "cuda_rng": _cuda_rng(me), "position": position}
    watch.watching = True
    save(path, model, optimizer, scheduler, *position)
    watch.watching = False
    exists_on_return = os.path.exists(path)
    if me.rank == 1:
        open(watch.signal, "w").close()
    dist.barrier()  # the checker's: every rank's save is over before anything is loaded
    fresh = _build(config["seed"] + 1000, me)
    torch.manual_seed(12345 + me.rank)  # a restarted process starts from other random numbers
    random.seed(12345 + me.rank)
    np.random.seed(12345 + me.rank)
    loaded = load(path, *fresh)
    loaded_position = tuple(int(x) for x in loaded) if isinstance(loaded, (tuple, list)) and len(loaded) == 2 \
        else None
    return {"saved": saved, "calls": watch.calls, "exists_on_return": exists_on_return, "path": path,
            "targets": list(watch.targets),
            "after": {"params": _flat(fresh[0].parameters()), "momentum": _momentum(fresh[1]),
                      "scheduler": dict(fresh[2].state_dict()), "rng": torch.get_rng_state(),
                      "python_rng": random.getstate(), "numpy_rng": np.random.get_state(), "cuda_rng": _cuda_rng(me)},
            "loaded_position": loaded_position or position, "returned": loaded, "resumed": fresh}


# -- verdicts ------------------------------------------------------------------------------------------------------
def judge_state(measured: dict, rank: int) -> Finding:
    """Finding for ``training_state``."""
    saved, after = measured["saved"], measured["after"]
    if not torch.equal(saved["params"], after["params"]):
        return Finding("training_state", False, f"rank {rank}'s parameters after loading are not those saved: save "
                       "model.module.state_dict() (DDP keeps the model in .module) and load it into model.module")
    if not torch.equal(saved["momentum"], after["momentum"]):
        why = ("the optimizer has no momentum buffers: its state was not saved or not loaded. Save "
               "optimizer.state_dict() and call optimizer.load_state_dict() on load"
               if after["momentum"].numel() == 0 else "the momentum buffers differ from those saved")
        return Finding("training_state", False, f"rank {rank}'s optimizer after loading: {why}")
    if saved["scheduler"].get("last_epoch") != after["scheduler"].get("last_epoch"):
        return Finding("training_state", False, f"rank {rank}'s learning-rate scheduler after loading is at step "
                       f"{after['scheduler'].get('last_epoch')}, it was at {saved['scheduler'].get('last_epoch')}: "
                       "save scheduler.state_dict() and load it")
    return Finding("training_state", True)


def judge_rng(measured: dict, rank: int, rank0_rng: torch.Tensor) -> Finding:
    """Finding for ``rng_and_position``; ``rank0_rng`` is rank 0's state at the save."""
    saved, after = measured["saved"], measured["after"]
    if not torch.equal(saved["rng"], after["rng"]):
        if rank and torch.equal(after["rng"], rank0_rng):
            why = ("it is rank 0's: every rank draws its own dropout masks, so gather every rank's state "
                   "(dist.all_gather_object), save them all, and let each rank load its own")
        else:
            why = ("save torch.get_rng_state() (every rank's) and torch.set_rng_state() it on load: dropout draws "
                   "from it, so a resumed run without it draws other masks")
        return Finding("rng_and_position", False, f"rank {rank}'s random number generator after loading is not "
                       f"what it was when saved: {why}")
    for key, name, why in (
            ("cuda_rng", "CUDA", "dropout on a GPU draws from it; save torch.cuda.get_rng_state() too"),
            ("python_rng", "Python's random", "a data pipeline may draw from it; save random.getstate() too"),
            ("numpy_rng", "numpy's", "a data pipeline may draw from it; save np.random.get_state() too")):
        if not _same_state(saved.get(key), after.get(key)):
            return Finding("rng_and_position", False, f"rank {rank}'s {name} generator after loading is not what it "
                           f"was when saved: {why}, and set it back on load")
    if measured["returned"] is None or tuple(measured["loaded_position"]) != tuple(saved["position"]) \
            or not isinstance(measured["returned"], (tuple, list)):
        return Finding("rng_and_position", False, f"load_checkpoint returned {measured['returned']!r}, the run "
                       f"stopped at (epoch, step) = {saved['position']}: save epoch and step and return them")
    return Finding("rng_and_position", True)


def _same_state(a: object, b: object) -> bool:
    """Equal generator states (numpy's holds an array)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return a == b


def judge_atomic(measured: dict, rank: int) -> Finding:
    """Finding for ``atomic``, on rank 0: torch.save wrote another file, and ``path`` exists after the save."""
    if rank != 0:
        return Finding("atomic", True)
    target = os.path.abspath(measured["path"])
    if not measured["targets"]:
        return Finding("atomic", False, "rank 0 never called torch.save on a file in save_checkpoint")
    if target in measured["targets"]:
        return Finding("atomic", False, "rank 0's torch.save wrote the checkpoint in place: a crash in the middle "
                       "of the write would leave half a file and no checkpoint. Write to another file (path + "
                       "\".partial\") and os.replace() it onto path: a rename is atomic")
    if not measured["exists_on_return"]:
        return Finding("atomic", False, "rank 0 wrote another file but path did not exist when save_checkpoint "
                       "returned: os.replace() the file you wrote onto path")
    return Finding("atomic", True)


def judge_writer(measured: dict, rank: int) -> Finding:
    """Finding for ``one_writer`` on this rank."""
    calls = measured["calls"]
    if rank == 0 and calls == 0:
        return Finding("one_writer", False, "rank 0 never called torch.save in save_checkpoint: write the "
                       "checkpoint with torch.save on rank 0")
    if rank != 0 and calls:
        return Finding("one_writer", False, f"rank {rank} called torch.save too: every rank wrote the same file. "
                       "Only rank 0 writes (if dist.get_rank() == 0); the others wait at a barrier")
    if not measured["exists_on_return"]:
        return Finding("one_writer", False, f"the file did not exist yet when save_checkpoint returned on rank "
                       f"{rank}: end save_checkpoint with dist.barrier(), so no rank goes on (or loads) before "
                       "rank 0 has written it")
    return Finding("one_writer", True)


def _shared_folder(config: dict) -> str:
    """A folder every rank of this job names alike without a message (their launcher's address and parent
    process), emptied of an earlier run's files by rank 0 before any rank can write there."""
    job = f"{os.environ.get('MASTER_PORT', '')}-{os.getppid()}-{config['seed']}-{config['stop_at']}"
    folder = os.path.join(tempfile.gettempdir(), f"course-checkpoint-{job}")
    if world.current().rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, exist_ok=True)
    return folder


def check_on_rank(path: str, config: dict) -> RankFindings:
    """Run the uninterrupted and the stopped-and-resumed training on this rank; judge what came back."""
    me = world.current()
    folder = _shared_folder(config)
    watch = _WatchedSave(os.path.join(folder, "rank1-returned"), me.rank)
    torch.save = watch  # before the student's file is loaded, so a ``from torch import save`` is watched too
    try:
        save, load = load_entry(path, "save_checkpoint"), load_entry(path, "load_checkpoint")
        expected, _ = train(config, me)
        final, measured = train(config, me, save, load, os.path.join(folder, "checkpoint.pt"), watch)
    finally:
        torch.save = watch.original
    rank0_rng = measured["saved"]["rng"].to(me.device, copy=True)  # nccl moves device tensors only
    dist.broadcast(rank0_rng, src=0)
    rank0_rng = rank0_rng.cpu()
    world.settle()
    dist.barrier()
    if me.rank == me.world_size - 1:  # the last rank: (one after the other, as a test may run them) the last done
        shutil.rmtree(folder, ignore_errors=True)
    gap = (final - expected).abs().max().item()
    same = torch.equal(final, expected)
    return RankFindings([
        judge_state(measured, me.rank), judge_rng(measured, me.rank, rank0_rng), judge_writer(measured, me.rank),
        judge_atomic(measured, me.rank),
        Finding("bit_for_bit", same, "" if same else f"rank {me.rank}'s final parameters differ from the "
                f"uninterrupted run's by up to {gap:.3g}: whatever a step depends on must be in the checkpoint "
                "(see the checks above)"),
    ])


def _run(stop_at: int, seed: int | str, where: str) -> dict:
    return {"world_size": 2, "seed": seed, "epochs": 3, "stop_at": stop_at, "timeout_s": 90,
            "label": f"stopped after step {{stop_at}} ({where}) of 12, resumed"}


LAB = Lab(
    name="checkpoint", title="a full checkpoint under DDP: save, load, resume bit-for-bit",
    notebook="09_real_gpu_practice", student_file="labs/checkpoint_resume.py", entry="save_checkpoint", checks=CHECKS,
    rank_check=check_on_rank, shortcuts=SHORTCUTS,
    runs=(_run(6, 0, "mid-epoch"),),
    variant={"stop_at": (6, 5, 7, 9, 10)},  # each student's own, every one mid-epoch (grader.labs.variant)
    hidden_runs=(_run(8, "jitter", "at an epoch's end"),),
    hang_hint=("A hang here usually means one rank called a collective (a barrier, all_gather_object) that the "
               "other did not, e.g. inside an `if rank == 0:`."),
)
