"""DDP as a script: notebook 05's step-by-step conversion of a single-device script, and torchrun to run it.

Notebook 05 (``notebooks/05_ddp.ipynb``) turns the single-device script ``notebooks/ddp_steps/step0_*.py``
into a DDP script one numbered step at a time; :func:`step_scripts` and :func:`step_diff` show each step as a
diff, :func:`run_torchrun` launches a script the way you would from a terminal (:func:`torchrun_command` is its
command line, on one node or several; :func:`torchrun_environment` its environment), and
:func:`torchrun_in_background` starts one that the notebook collects later. DDP's internals, checked
against ``DistributedDataParallel``, are in :mod:`course.ddp.internals`.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

from course import world
from course.runtime import process, root_cause

STEPS_DIR = Path(__file__).resolve().parents[2] / "notebooks" / "ddp_steps"


# -- the scripts ------------------------------------------------------------------------------------------------
def step_scripts(directory: str | Path = STEPS_DIR) -> list[Path]:
    """The numbered scripts ``step0_*.py``, ``step1_*.py``, ... of ``directory``, in step order.

    Raises:
        FileNotFoundError: no step scripts there.
    """
    scripts = sorted(Path(directory).glob("step[0-9]*_*.py"), key=lambda p: int(p.name[4:p.name.index("_")]))
    if not scripts:
        raise FileNotFoundError(f"no step<N>_<name>.py scripts in {directory}.")
    return scripts


def step_diff(before: str | Path, after: str | Path, context: int = 1) -> str:
    """The unified diff from script ``before`` to script ``after`` (``+`` lines are what the step adds)."""
    old, new = Path(before), Path(after)
    return "".join(difflib.unified_diff(old.read_text().splitlines(keepends=True),
                                        new.read_text().splitlines(keepends=True),
                                        fromfile=old.name, tofile=new.name, n=context))


def torchrun_command(script: str | Path, nproc_per_node: int = 4, script_args: tuple[str, ...] = (),
                     nnodes: int = 1, node_rank: int | None = None, rdzv_endpoint: str = "node0.example:29500",
                     rdzv_id: str = "job42", local_addr: str | None = None) -> list[str]:
    """The ``torchrun`` command line for ``script``: ``--standalone`` on one node, c10d rendezvous on several.

    On several nodes the *same* command runs on every node: they meet at ``rdzv_endpoint`` (host:port of the
    node that hosts the rendezvous store) under one ``rdzv_id``, and the rendezvous gives each node its rank
    (``GROUP_RANK``) and every process its ``RANK``/``WORLD_SIZE``. ``--node_rank`` is only for the static
    rendezvous (``--master_addr``); pass ``node_rank`` to pin it anyway. ``local_addr``: the address this node
    is reached at, when its host name does not resolve to it (e.g. inside a network namespace).
    """
    command = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        command += ["--standalone"]
    else:
        command += [f"--nnodes={nnodes}", *([f"--node_rank={node_rank}"] if node_rank is not None else []),
                    "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={rdzv_id}",
                    *([f"--local_addr={local_addr}"] if local_addr else [])]
    return command + [f"--nproc_per_node={nproc_per_node}", str(script), *script_args]


def run_torchrun(script: str | Path, nproc_per_node: int = 4, script_args: tuple[str, ...] = (),
                 timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    """Run ``script`` under torchrun on this node and return the finished process (output captured).

    Raises:
        RuntimeError: it failed or timed out; the message ends with the last lines of its output.
    """
    world.check_world_size(nproc_per_node)
    command = torchrun_command(script, nproc_per_node, script_args)
    outcome = process.run(command, timeout_s, env=torchrun_environment(nproc_per_node))  # all ranks stopped after
    if outcome.status == "timeout":
        raise RuntimeError(f"torchrun {Path(script).name} did not finish in {timeout_s:g} s (all its ranks were "
                           f"stopped); last output:\n{outcome.stdout[-2000:]}")
    done = subprocess.CompletedProcess(command, outcome.returncode, outcome.stdout, outcome.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun {Path(script).name} failed; last output:\n"
                           f"{root_cause.explain(done.returncode, done.stdout, done.stderr, stdout_chars=1000)}")
    return done


def torchrun_in_background(script: str | Path, nproc_per_node: int = 4, script_args: tuple[str, ...] = (),
                           timeout_s: float = 180.0) -> Future:
    """:func:`run_torchrun` in a thread of its own: the notebook goes on meanwhile (notebook 05 trains its seeds
    while the next run trains), and ``.result()`` returns the finished process or raises its error."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(run_torchrun(script, nproc_per_node, script_args, timeout_s))
        except BaseException as error:  # noqa: BLE001 - handed to whoever asks for the result
            future.set_exception(error)

    threading.Thread(target=run, name=f"torchrun {Path(script).name}", daemon=True).start()
    return future


def torchrun_environment(nproc_per_node: int) -> dict[str, str]:
    """This process's environment for a torchrun job: the course importable, each rank its share of the cores."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the course package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # torchrun would otherwise set 1 and warn about it
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    return env
