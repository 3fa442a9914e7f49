"""Isolation with bubblewrap (``bwrap``), the distribution's maintained sandboxing tool, as an argv prefix.

    bwrap --die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-net [--unshare-user]
          --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /var/tmp --bind RUN_DIR RUN_DIR
          --dev-bind /dev/null SECRET --chdir RUN_DIR -- python -I exec.py CONFIG

gives the command: a pid namespace (bwrap's init is process 1; when it ends, the kernel kills every process
inside, escapees included), no network but ``lo`` (up: gloo and torchrun rendezvous work), a file system that
is read-only except its run directory and its own empty /tmp, /var/tmp and /dev/shm (nothing is left for the next
run), the grader's secret covered by an empty file, and a private IPC namespace. :mod:`grader.sandbox.exec` then
sets the rlimits and, as root, the sandbox uid, and execs the command. Without root bubblewrap needs
unprivileged user namespaces (``--unshare-user`` maps the user to themself); :func:`unavailable_reason` tries it once.
Where bubblewrap is missing, :mod:`grader.sandbox` falls back to :mod:`grader.sandbox.namespaces`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

EXEC = str(Path(__file__).resolve().with_name("exec.py"))
MASKED = ("/tmp", "/var/tmp", "/dev/shm")  # each a fresh tmpfs inside, writable by all (1777)


@functools.cache
def unavailable_reason() -> str | None:
    """Why bubblewrap cannot be used here, or None if it can (installed, and it starts a namespaced ``true``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = [bwrap, *_user_namespace(), "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc",
             "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap does not start here ({e})"
    return None if done.returncode == 0 else f"bubblewrap does not start here: {done.stderr.strip()[-300:]}"


def _user_namespace() -> list[str]:
    return [] if os.geteuid() == 0 else ["--unshare-user"]


def command(config: dict, hide: list[str], needed: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """The bwrap command line that runs ``config["argv"]`` contained, and the mechanisms it makes active.

    ``config``: as :func:`grader.sandbox.exec.exec_command` takes it. ``hide``: files to cover with an empty one.
    ``needed``: paths the command must reach (the Python installation, the program): bound back where a masked
    directory (/tmp) or, for a sandbox uid, a private one (``/root``, 0700) would hide them.
    """
    cwd, uid, network = config["cwd"], config["uid"], config["limits"]["network"]
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session", *_user_namespace(),
            "--unshare-pid", "--unshare-ipc", *([] if network else ["--unshare-net"]),
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    mechanisms = ["bubblewrap", "own session", *(["user namespace"] if os.geteuid() != 0 else []),
                  *([f"uid {uid}"] if uid is not None else []), "pid namespace", "mount namespace", "ipc namespace",
                  *([] if network else ["network namespace"])]
    for device in sorted(Path("/dev").glob("nvidia*")):  # GPUs, where there are
        argv += ["--dev-bind", str(device), str(device)]
    for folder in MASKED:
        argv += ["--perms", "1777", "--tmpfs", folder]
    masked = [*MASKED, *(_private_dirs(needed + [EXEC], uid) if uid is not None else [])]
    for folder in masked[len(MASKED):]:
        argv += ["--tmpfs", folder]
    made: set[str] = set()
    for path in sorted(set(needed + [EXEC])):  # not a masked folder itself, nor the run dir or a folder above it
        if not _under(cwd, path) and any(_under(path, folder) and path != folder for folder in masked):
            argv += [*_parents(path, masked, made), "--ro-bind", path, path]
    argv += [*_parents(cwd, masked, made), "--bind", cwd, cwd]
    for path in hide:
        argv += [*_parents(path, masked, made), "--dev-bind", "/dev/null", path]  # reads empty; writes vanish
    argv += ["--chdir", cwd, "--", sys.executable, "-I", EXEC, json.dumps(config)]
    return argv, (*mechanisms, "rlimits")


def exit_code(returncode: int | None) -> int | None:
    """The command's exit code from bwrap's: bwrap exits 128+N when signal N ended the command (returned -N)."""
    if returncode is not None and returncode > 128 and (returncode - 128) in signal.Signals._value2member_map_:
        return 128 - returncode
    return returncode


def _parents(path: str, masked: list[str], made: set[str]) -> list[str]:
    """Options making the directories between a masked folder and ``path`` traversable (bwrap makes them 0700)."""
    options = []
    for parent in reversed(Path(path).parents):
        folder = str(parent)
        if folder not in made and any(_under(folder, m) and folder != m for m in masked):
            made.add(folder)
            options += ["--perms", "0755", "--dir", folder]
    return options


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _private_dirs(paths: list[str], uid: int) -> list[str]:
    """The outermost directories above ``paths`` that ``uid`` may not traverse (each is covered, see command)."""
    found: list[str] = []
    for path in paths:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            folder = str(Path(*parts[:depth]))
            if any(_under(folder, f) for f in (*found, *MASKED)):
                break
            st = os.stat(folder)
            if not st.st_mode & 0o001 and st.st_uid != uid:
                found.append(folder)
                break
    return found
