"""``course``: the students' command line.

    course info                   what hardware was found, what will be emulated, GPU links, library versions
    course hello --world-size 4   the 4-rank hello world of notebook 00, from a terminal
    course lab                    JupyterLab on the course's notebooks/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from course import world


def notebooks_dir() -> Path:
    """The course's ``notebooks/`` folder: beside the package in a clone, else under the current directory.

    Raises:
        FileNotFoundError: neither exists.
    """
    for candidate in (Path(__file__).resolve().parent.parent / "notebooks", Path.cwd() / "notebooks"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        "no notebooks/ folder found beside the course package or in the current directory; run "
        "`course lab` from the root of a clone of multigpu-course."
    )


def info_lines(world_size: int = 4, hardware: world.Hardware | None = None, nvml: Any = None) -> list[str]:
    """The lines ``course info`` prints: the hardware found (default: detected now), what ``world_size`` ranks
    will run on, the links between the GPUs when there are some (read from NVML; tests pass a fake ``nvml``),
    and the library versions."""
    hardware = hardware or world.detect_hardware()
    if hardware.emulated:
        found = "no GPU found" if os.environ.get(world.EMULATE_ENV) != "1" else f"GPUs hidden by {world.EMULATE_ENV}=1"
    else:
        found = f"{hardware.gpu_count} GPU(s): {', '.join(hardware.gpu_names)}"
    lines = [
        f"hardware    : {found}; {hardware.cpu_count} CPU core(s)",
        f"backend     : {hardware.backend_for(world_size)}",
        f"with {world_size} ranks: {plan(world_size, hardware)}",
    ]
    if not hardware.emulated:
        from course.monitor import interconnect

        links = interconnect.describe(nvml)
        lines += [f"{'interconnect' if i == 0 else '':<12}: {link}" for i, link in enumerate(links)]
    lines += [f"{name:<12}: {version}" for name, version in world.versions().items()]
    return lines


def plan(world_size: int, hardware: world.Hardware) -> str:
    """What launching ``world_size`` ranks on ``hardware`` will do, or why it will be refused."""
    try:
        world.check_world_size(world_size, hardware)
    except ValueError as refusal:
        return f"will be refused: {refusal}"
    return hardware.describe(world_size)


# labconfig/ holds the course's Lab settings: no news pop-up
LAB_CONFIG = Path(__file__).resolve().parent / "jupyter_config"


def lab_command(extra: list[str], root: Path | None = None) -> list[str]:
    """The command ``course lab`` runs: JupyterLab rooted at ``root`` (default: the course's notebooks).

    Its terminals run bash with the course's rc file (``jupyter_config/bashrc``): the user's ``~/.bashrc``, then
    the course's ``bin/`` back in front of ``PATH``. Jupyter's default, a login shell, would read ``/etc/profile``,
    which resets ``PATH`` and hides the course's ``torchrun``, ``grader`` and ``course``.
    """
    # Jupyter refuses to start as root (containers, cloud VMs) unless told it is deliberate.
    as_root = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    bash = shutil.which("bash")
    shell = [bash, "--rcfile", str(LAB_CONFIG / "bashrc")] if bash else [os.environ.get("SHELL") or "/bin/sh"]
    terminals = json.dumps({"shell_command": shell})
    return [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root or notebooks_dir()}",
            f"--ServerApp.terminado_settings={terminals}", *as_root, *extra]


def lab_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of ``course lab``, inherited by its kernels and terminals: the ``bin/`` of the Python
    that runs the course first on ``PATH`` (so ``torchrun``, ``grader``, ``course`` and ``python`` are the
    course's, as the notebooks' terminal commands expect), ``VIRTUAL_ENV`` set when that Python is a venv's, and the
    course's Lab settings (:data:`LAB_CONFIG`) on ``JUPYTER_CONFIG_PATH``.

    Args:
        base: the environment to extend (default: this process's).
    """
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir)])
    env["COURSE_BIN"] = bin_dir  # read by the terminals' rc file, after the user's ~/.bashrc
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(filter(None, [str(LAB_CONFIG), env.get("JUPYTER_CONFIG_PATH")]))
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course", description="Multi-GPU training course.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="hardware found, what will be emulated, library versions")
    hello = commands.add_parser("hello", help="each rank reports, then a tensor is all-reduced and checked")
    hello.add_argument("-n", "--world-size", type=int, default=4, help="number of ranks (default 4)")
    commands.add_parser("lab", help="open the course in JupyterLab (extra arguments go to jupyter)")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "lab":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")

    if args.command == "info":
        print("\n".join(info_lines()))
        return 0
    if args.command == "hello":
        from course.hello import hello as hello_fn
        from course.runtime.launch import RankFailed, RankTimeout, launch

        try:
            reports = launch(hello_fn, args.world_size, timeout_s=120)
        except (ValueError, RankFailed, RankTimeout) as error:
            print(f"course hello: {error}", file=sys.stderr)
            return 1
        print(f"all {len(reports)} ranks agree: all_reduce(rank + 1) = {reports[0]['reduced']:g}")
        return 0
    try:
        command = lab_command(extra)
    except FileNotFoundError as error:
        print(f"course lab: {error}", file=sys.stderr)
        return 1
    os.chdir(notebooks_dir())  # where the Lab's terminals start, so `python assignment/train_1gpu.py` works there
    os.execve(command[0], command, lab_environment())
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
