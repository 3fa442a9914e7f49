"""Run a library function on N ranks from a notebook, the way torchrun runs a script.

``launch(fn, world_size=4)`` starts one process per rank, joins them into a process group (gloo on
emulated GPUs, nccl on real ones), calls ``fn`` on every rank and returns the per-rank results in rank
order. Output printed by a rank (stdout and stderr) appears in the notebook prefixed with ``[rank k]``. If any
rank raises, every other rank is stopped and :class:`RankFailed` names the rank and shows its traceback (or,
for a rank that died without a word, how it ended and the end of its stderr); if ranks are stuck (none has made
progress for 20 s while one waits for another, :mod:`course.runtime.progress`) or do not finish in time,
:class:`RankTimeout` names the ones that were not waiting in a collective or for a message, and says which ranks
waited for them and where, and whom a rank waiting for a message waited for (:mod:`course.runtime.waits`). A
rank that is only slow keeps using processor time, and is waited for. No process is left behind either way.
Taught in ``notebooks/00_start_here.ipynb``.

``fn`` must be importable (defined in a module, not in a notebook cell): each rank is a fresh process.

A rank's output reaches the notebook through :mod:`course.runtime.rank_output`. The three ways a launch ends
(results; a failure traced to the rank that caused it; a timeout blamed on the ranks the others waited for) stay
here: they share the loop that watches the ranks. The fork server the ranks start from is
:mod:`course.runtime.fork_server`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import queue
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing import resource_tracker
from typing import Any

import psutil
import torch.distributed as dist

from course import world
from course.runtime import environment, fork_server, observed, paths, progress, rank_stacks, waits
from course.runtime.pace import machine_pace
from course.runtime.process_tree import kill_tree
from course.runtime.rank_output import RankOutput, StderrRelay, stderr_to


class RankFailed(RuntimeError):
    """A rank raised an exception or died; ``rank`` says which, ``remote_traceback`` says why (its paths short)."""

    def __init__(self, rank: int, remote_traceback: str) -> None:
        self.rank = rank
        self.remote_traceback = paths.shorten(remote_traceback)
        super().__init__(
            f"rank {rank} failed; the other ranks were stopped.\n--- on rank {rank} ---\n"
            f"{self.remote_traceback.rstrip()}"
        )


class RankTimeout(TimeoutError):
    """Some ranks were stuck (no progress for a while) or did not finish within the time limit; ``ranks`` lists
    the ones at fault.

    A rank blocked in a collective (``all_reduce``, ``barrier``, ...) or on a message (``recv``, an ``irecv``'s
    ``wait()``) is waiting for a peer, not at fault: ``ranks`` names the ranks that were elsewhere (sleeping,
    computing, stuck), and ``waiting`` maps each rank that waited to where (the collective's name, ``"to receive
    from rank 3 (its irecv number 1 from rank 3)"``, or ``"finished"`` for a rank that had returned its result).
    If every unfinished rank was waiting (in different collectives, or for messages nobody sends), all of them are
    at fault; ``wrong_peers`` then says which messages went to a rank that never receives from their sender
    (:func:`course.runtime.waits.wrong_peers`). ``idle_s`` is set when the ranks were stopped because none had
    made progress for that long (:mod:`course.runtime.progress`); else the time limit ran out, ``timeout_s``
    seconds (``note`` says why it was longer than asked, if it was).
    """

    def __init__(self, ranks: list[int], timeout_s: float, waiting: dict[int, str] | None = None,
                 idle_s: float | None = None, note: str = "", wrong_peers: list[str] | None = None) -> None:
        self.ranks = ranks
        self.waiting = dict(waiting or {})
        self.idle_s = idle_s
        self.wrong_peers = list(wrong_peers or [])
        names = ", ".join(str(r) for r in ranks)
        if idle_s is not None:
            what = f"rank(s) {names} made no progress for {idle_s:g} s (no processor time used)"
        else:
            limit = round(timeout_s, 1)  # a limit stretched by the machine's pace: 7 s, not 6.96779 s
            what = f"rank(s) {names} did not finish within {limit:g} s{f' ({note})' if note else ''}"
        if any(where.startswith("to ") for where in self.waiting.values()):
            hint = ("A rank that waits for a message no rank sends it hangs like this"
                    + (f": {'; '.join(self.wrong_peers)}. Check the peer ranks of your sends and receives."
                       if self.wrong_peers else ": check the peer ranks of your sends and receives."))
        else:
            hint = ("A rank that waits in a collective (all_reduce, barrier, broadcast) that another rank never calls "
                    "hangs like this.")
        super().__init__(f"{what}{_why(ranks, self.waiting)}, and every rank was stopped. {hint}")


def _why(ranks: list[int], waiting: dict[int, str]) -> str:
    """``" (ranks 0, 2 were waiting for it in all_reduce)"``, or ``""`` when nobody was seen waiting."""
    grouped: dict[tuple[bool, str], list[int]] = {}
    for rank in sorted(waiting):
        grouped.setdefault((rank in ranks, waiting[rank]), []).append(rank)
    target = "it" if len(ranks) == 1 else "them"
    parts = []
    for (at_fault, where), group in grouped.items():
        names = f"rank {group[0]}" if len(group) == 1 else f"ranks {', '.join(map(str, group))}"
        was = "was" if len(group) == 1 else "were"
        if where.startswith("to "):  # for a message: whom it waited for is in ``where``
            parts.append(f"{names} {was} waiting {where}")
        elif at_fault:  # every unfinished rank waits in a collective: none of them can be the one that never came
            parts.append(f"{names} {was} waiting in {where}, a collective no other rank joined")
        elif where == "finished":
            parts.append(f"{names} had finished and {was} waiting for {target}")
        else:
            parts.append(f"{names} {was} waiting for {target} in {where}")
    return f" ({'; '.join(parts)})" if parts else ""


_LOOK_S = 0.5  # how often launch() samples the ranks' progress


def _run_rank(fn: bytes, rank: int, world_size: int, port: int, timeout_s: float, arguments: bytes,
              channel: Any, stacks_path: str, stderr_path: str, environment: dict[str, str], waits_path: str) -> None:
    """Body of one rank's process: join the group, call ``fn``, report the outcome on ``channel``.

    A rank forked from the server has the server's environment and stderr: it takes the launching process's
    environment of now, and sends its stderr (and that of all it starts) to its own file, before anything else.
    """
    gc.freeze()  # torch's objects, imported by the server, are never garbage: the collector skips them (-15% CPU)
    os.environ.clear()
    os.environ.update(environment)
    with open(stderr_path, "ab") as target:
        os.dup2(target.fileno(), 2)
    rank_stacks.answer_requests(stacks_path)
    # before fn's module is loaded, so that its `from torch.distributed import irecv` is heard too
    waits.Recorder(waits.to_file(waits_path)).start()
    fn = pickle.loads(fn)
    args, kwargs = pickle.loads(arguments)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
    )
    sys.stdout = RankOutput(rank, channel)
    observed.install()  # every gloo group the rank makes records its calls and keeps NCCL's rules
    try:
        with _store_served_by_launch():
            world.init_from_env(timeout_s=timeout_s)
        # Plain pickle copies tensors by value: the queue's own pickler would share their memory, which
        # vanishes when this process exits before the launcher reads it.
        result = pickle.dumps(fn(*args, **kwargs))
        observed.settle()  # collectives that differ after the last sampled agreement check fail here
        sys.stdout.flush()
        channel.put(("ok", rank, result))
    except BaseException:  # noqa: B036 - the launcher must hear about every way a rank can end
        sys.stdout.flush()
        channel.put(("error", rank, traceback.format_exc()))
        world.shutdown(barrier=False)
    else:
        try:
            world.shutdown()
        except Exception:  # noqa: BLE001 - a peer died before the closing barrier: its own rank reports why
            world.shutdown(barrier=False)  # and this rank, whose work is done, must not pass for the one that failed
        else:
            channel.put(("left", rank))


def _timeout(processes: list[Any], results: dict[int, Any], left: set[int], run_dir: str, timeout_s: float,
             note: str = "") -> RankTimeout:
    """Blame the unfinished ranks that are not waiting in a collective or for a message: the others wait for them."""
    unfinished = sorted(set(range(len(processes))) - set(results))
    records = _records(len(processes), run_dir)
    waiting = _where_waiting(processes, unfinished, run_dir, records)
    at_fault = [rank for rank in unfinished if rank not in waiting] or unfinished
    return RankTimeout(at_fault, timeout_s, {**waiting, **_finished(processes, results, left)}, note=note,
                       wrong_peers=waits.wrong_peers(records))


def _records(world_size: int, run_dir: str) -> dict[int, waits.Record]:
    """Each rank's record of its messages (:mod:`course.runtime.waits`), for the ranks that have written one."""
    found = {rank: waits.read(os.path.join(run_dir, f"rank-{rank}.waits")) for rank in range(world_size)}
    return {rank: record for rank, record in found.items() if record is not None}


def _where_waiting(processes: list[Any], ranks: list[int], run_dir: str, records: dict[int, waits.Record]
                   ) -> dict[int, str]:
    """Where each of ``ranks`` that waits does: for a message (its record says so), else in a collective (its
    stack says so)."""
    on_messages = {rank: where for rank in ranks if (where := waits.where(rank, records)) is not None}
    others = [rank for rank in ranks if rank not in on_messages]
    return {**rank_stacks.where_blocked(processes, others, run_dir), **on_messages}


def _finished(processes: list[Any], results: dict[int, Any], left: set[int]) -> dict[int, str]:
    """The ranks that returned their result and still wait for the others (in the closing barrier)."""
    return {rank: "finished" for rank in results if rank not in left and processes[rank].is_alive()}


def _stuck(processes: list[Any], results: dict[int, Any], left: set[int], run_dir: str, watch: progress.Watch
           ) -> RankTimeout | None:
    """A RankTimeout if no unfinished rank has made progress for the watch's window while some rank waits for
    another (in a collective, for a message, or having finished); else None. Nobody waiting: the time limit decides.

    Progress is processor time, or a message posted or waited for (each rank's record, :mod:`course.runtime.waits`);
    a rank blocked in one wait for a message for the whole window made none, whatever its processor time (on GPUs
    a rank blocked in nccl may spin a processor: the wait is the evidence that counts)."""
    unfinished = {rank: p.pid for rank, p in enumerate(processes) if rank not in results and p.pid is not None}
    if not unfinished:
        return None
    records = _records(len(processes), run_dir)
    serials = {rank: records[rank].serial for rank in unfinished if rank in records}
    blocked = frozenset(rank for rank in unfinished if rank in records and records[rank].waiting)
    if not watch.look(unfinished, serials, blocked=blocked).stuck:
        return None
    waiting = _where_waiting(processes, sorted(unfinished), run_dir, records)
    finished = _finished(processes, results, left)
    if not waiting and not finished:
        watch.samples.clear()  # look again after another whole window
        return None
    at_fault = [rank for rank in sorted(unfinished) if rank not in waiting] or sorted(unfinished)
    return RankTimeout(at_fault, watch.window_s, {**waiting, **finished}, idle_s=watch.window_s,
                       wrong_peers=waits.wrong_peers(records))


def _stop(processes: list[Any]) -> None:
    """Kill every rank and everything it started (DataLoader workers included), then reap them."""
    for process in processes:  # freeze all first: a rank that sees a peer die mid-collective prints a traceback
        if process.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGSTOP)
    for process in processes:
        if process.pid is None:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            kill_tree(psutil.Process(process.pid))
        process.join(timeout=10)


def launch(fn: Callable[..., Any], world_size: int | world.Plan = 4, *args: Any, timeout_s: float = 120.0,
           **kwargs: Any) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on ``world_size`` ranks and return their results in rank order.

    Args:
        fn: an importable function; inside it, ``course.world.current()`` says which rank it runs on.
        world_size: number of ranks (GPUs, or CPU processes emulating them), or a :func:`course.world.plan`, whose
            world size is used and whose sentence is printed where there are GPUs (``launch(fn, world.plan(4))``
            runs 2 ranks on nccl on a 2-GPU machine, 4 emulated ones on a machine with none).
        timeout_s: wall-clock limit for the whole job, in seconds, on a quiet machine: it grows on a busy or
            slow one (:func:`course.runtime.pace.machine_pace`), up to 4 times. Ranks that all stop making
            progress while one waits for another are stopped sooner, after ``progress.WINDOW_S`` (20 s).

    Returns:
        ``[result_of_rank_0, result_of_rank_1, ...]``; results must be picklable.

    Every rank gets its own copy of ``args`` and ``kwargs`` (a model passed in and trained by the ranks is left
    as it was in the caller); results come back by value.

    Raises:
        ValueError: bad ``world_size`` (see :func:`course.world.check_world_size`).
        TypeError: arguments that cannot be pickled.
        RankFailed: a rank raised or died; the others were stopped.
        RankTimeout: ranks stuck (no progress while another waits for them) or still running after the time
            limit; all were stopped. ``ranks`` names those not waiting in a collective or for a message (the ones
            the others waited for).
    """
    hardware = world.detect_hardware()
    chosen = world_size if isinstance(world_size, world.Plan) else None
    world_size = world.check_world_size(chosen.world_size if chosen else world_size, hardware)
    if not hardware.emulated:  # GPUs: say whether the ranks get one each, and what the timings then mean
        print(f"launch: {chosen.sentence if chosen else hardware.describe(world_size)}", flush=True)
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(fn, "__qualname__", ""):
        raise ValueError(
            f"launch() needs an importable function, but {getattr(fn, '__qualname__', fn)!r} is defined in a "
            "notebook cell or inside another function. Put it in a .py module and import it."
        )
    # Plain pickle: every rank gets its own copy of the arguments. The spawn context's pickler would put their
    # tensors in shared memory, so a rank training a model it was passed would train everyone's (and yours).
    try:
        arguments = pickle.dumps((args, kwargs))
        function = pickle.dumps(fn)
    except Exception as error:  # noqa: BLE001 - any pickling failure means the same thing here
        raise TypeError(f"launch() sends fn's arguments to every rank by pickling them, and they cannot be "
                        f"pickled: {error}. Pass data (tensors, numbers, models, lists), not open files, locks or "
                        "lambdas.") from None
    context = fork_server.context()
    channel = context.Queue()
    store = _host_store(world_size)
    run_dir = tempfile.mkdtemp(prefix="course-launch-")  # per rank: stack dumps on request, stderr
    start_up = fork_server.start_up_file(context)
    stderr = StderrRelay([os.path.join(run_dir, f"rank-{rank}.stderr") for rank in range(world_size)], start_up)
    pace = machine_pace()
    # the process group's own timeout outlasts this launcher's limits, so that the progress rule or the time limit
    # names a hang (who waits where), not gloo's "timed out" on whichever rank waited longest
    group_timeout_s = pace.limit(timeout_s) + progress.WINDOW_S
    processes = [
        context.Process(target=_run_rank, name=f"course-rank-{rank}",
                        args=(function, rank, world_size, store.port, group_timeout_s, arguments, channel,
                              os.path.join(run_dir, f"rank-{rank}.stacks"), stderr.paths[rank], dict(os.environ),
                              os.path.join(run_dir, f"rank-{rank}.waits")))
        for rank in range(world_size)
    ]
    results: dict[int, Any] = {}
    left: set[int] = set()  # ranks that have left the process group after reporting
    failed: int | None = None  # the rank blamed by RankFailed: its peers' last stderr is the echo of its failure
    silent_since: dict[int, float] = {}
    try:
        resource_tracker.ensure_running()  # started now, it keeps this process's stderr, not a rank's
        for rank, process in enumerate(processes):
            with stderr_to(start_up or stderr.paths[rank]):  # the fork server's (it starts now), or a spawned rank's
                process.start()
        fork_server.note_server(context)
        deadline = time.monotonic() + pace.limit(timeout_s)
        watch, next_look = progress.Watch(progress.WINDOW_S), 0.0
        while len(results) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _timeout(processes, results, left, run_dir, pace.limit(timeout_s), pace.stretched(timeout_s))
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + _LOOK_S
                stuck = _stuck(processes, results, left, run_dir, watch)
                if stuck:
                    raise stuck
            try:
                message = channel.get(timeout=min(0.2, remaining))
            except queue.Empty:
                message = ("quiet",)
            if message[0] == "quiet":
                stderr.relay()
                _check_silent_deaths(processes, results, silent_since, stderr, run_dir)
            elif message[0] == "out":
                sys.stdout.write(message[1])
            elif message[0] == "ok":
                results[message[1]] = pickle.loads(message[2])
            elif message[0] == "left":  # a quick rank can leave before the others' results are read
                left.add(message[1])
            else:
                raise _root_cause(message[1], message[2], processes, stderr, run_dir)
        _let_exit(processes, channel, deadline, left)
        return [results[rank] for rank in range(world_size)]
    except RankFailed as failure:
        failed = failure.rank
        raise
    finally:
        sys.stdout.flush()
        _stop(processes)
        del store  # its server closes: the port is free again
        stderr.relay(final=True, failed=failed)
        shutil.rmtree(run_dir, ignore_errors=True)


def _store_served_by_launch() -> contextlib.AbstractContextManager[None]:
    """While a rank joins launch's group: connect to the store :func:`_host_store` serves, as torchrun's ranks do.

    Unset after, so that a group ``fn`` makes itself (on a port of its own) is served by its rank 0, as before.
    """
    return environment.variables({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"})


def _host_store(world_size: int) -> Any:
    """The ranks' rendezvous store, served from this process as torchrun's agent serves it.

    It listens on a port the system picks as it binds, so no other process can take that port first. (When rank
    0 served it on a port found free a moment earlier, another job on the machine sometimes took the port in
    between, and rank 0 failed with EADDRINUSE.) The ranks only connect to it (``TORCHELASTIC_USE_AGENT_STORE``).
    """
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)


def _let_exit(processes: list[Any], channel: Any, deadline: float, left: set[int], grace_s: float = 30.0) -> None:
    """Give ranks that have all reported the time to leave the process group together before any is killed.

    Killing a rank while a peer is still in ``world.shutdown()``'s barrier makes that peer print a
    "Connection reset by peer" traceback. Once every rank has said it left, the rest of its exit (the
    interpreter's teardown) is not waited for. Output still in the channel is relayed meanwhile.
    """
    until = min(deadline, time.monotonic() + grace_s)
    while len(left) < len(processes) and any(p.is_alive() for p in processes) and time.monotonic() < until:
        try:
            message = channel.get(timeout=0.05)
        except queue.Empty:
            continue
        if message[0] == "out":
            sys.stdout.write(message[1])
        elif message[0] == "left":
            left.add(message[1])


def _root_cause(rank: int, remote_traceback: str, processes: list[Any], stderr: StderrRelay, run_dir: str,
                wait_s: float = 1.0) -> RankFailed:
    """The failure to report: a rank that died silently first makes its peers fail in collectives, so blame it."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for other, process in enumerate(processes):
            if other != rank and process.exitcode not in (None, 0):
                last_line = remote_traceback.strip().splitlines()[-1]
                return _died(other, process.exitcode, stderr, run_dir, f"rank {rank} then failed with: {last_line}")
        time.sleep(0.05)
    return RankFailed(rank, remote_traceback)


def _check_silent_deaths(processes: list[Any], results: dict[int, Any], silent_since: dict[int, float],
                         stderr: StderrRelay, run_dir: str, grace_s: float = 2.0) -> None:
    """Raise for a rank whose process ended without reporting (killed, segfault, ``os._exit``).

    A rank that exits normally has already queued its report; the grace period lets it arrive.
    """
    now = time.monotonic()
    for rank, process in enumerate(processes):
        if rank in results or process.exitcode is None:
            continue
        if now - silent_since.setdefault(rank, now) > grace_s:
            raise _died(rank, process.exitcode, stderr, run_dir)


def _died(rank: int, exitcode: int, stderr: StderrRelay, run_dir: str, then: str = "") -> RankFailed:
    """RankFailed for a rank that ended without reporting: how it ended, the end of its stderr, and the likely fix."""
    how = f"exited with code {exitcode}"
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            how = f"was killed by {signal.Signals(-exitcode).name}"
    reason = f"process {how} without reporting a result"
    if not os.path.exists(os.path.join(run_dir, f"rank-{rank}.stacks")):  # _run_rank never began
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        reason += (
            ", before it could call fn. Each rank is a fresh Python process that first imports your script"
            f"{f' ({main})' if main else ''} and fn's module; if the script calls launch() at top level, put that "
            "call under `if __name__ == \"__main__\":`, and check that fn's module imports without error"
        )
    text = f"{reason}{'; ' + then if then else '.'}"
    if tail := stderr.tail(rank):
        return RankFailed(rank, f"{text}\n--- end of rank {rank}'s stderr ---\n{tail}")
    if tail := stderr.start_up_tail():  # it failed before it had a stderr file of its own
        return RankFailed(rank, f"{text}\n--- end of what the ranks wrote as they started ---\n{tail}")
    return RankFailed(rank, text)


def in_turn(*calls: tuple[Callable[..., Any], tuple]) -> list[Any]:
    """Rank function: call each ``(fn, args)`` in turn on this rank; returns their results in order.

    Starting ranks takes seconds, so a notebook that needs several rank functions on the same ranks runs them
    in one launch: ``launch(in_turn, 4, (horovod.recipe, ()), (ddp.compare_many, (configs,)))[rank][i]`` is
    call ``i``'s result on ``rank``. Every call must leave the process group as it found it.
    """
    return [fn(*args) for fn, args in calls]
