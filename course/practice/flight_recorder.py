"""Torch's flight recorder on gloo: every rank keeps a ring buffer of its last collectives, dumped on demand.

Set ``TORCH_FR_BUFFER_SIZE`` (entries kept) before the process group starts (:func:`recording`); then any thread
of a rank can dump the buffer as JSON (``torch._C._distributed_c10d._dump_fr_trace_json``) even while its main
thread is blocked inside a collective, which is exactly when you need it. :func:`dump_after` arms such a dump in
a rank; :func:`entries` reads one back. Each entry is one collective the rank *entered*: its sequence number in
the group (``collective_seq_id``), its name (``gloo:all_reduce``), and the tensor sizes.
Read the ranks side by side: the one whose last sequence number is behind the others is the one that skipped or
never reached a collective. (torch 2.13 records on gloo as shown here; on NCCL it also records start and end
times from CUDA events, and a job can dump automatically on a watchdog timeout.) Taught in
``notebooks/09b_profiling_and_pitfalls.ipynb``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from course.runtime import environment

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"

#: What a job on NCCL sets so that the flight recorder is useful when a collective times out (PyTorch's
#: flight recorder tutorial and its ProcessGroupNCCL environment variables). Older torch releases read
#: ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for the buffer and ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` for the file prefix.
NCCL_SETTINGS: dict[str, str] = {
    "TORCH_FR_BUFFER_SIZE": "2000",  # keep the last 2000 collectives per rank (0: no record)
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # the watchdog writes every rank's record when a collective times out
    "TORCH_FR_DUMP_TEMP_FILE": "/tmp/flight_record_rank_",  # where: this prefix, then the rank
    "TORCH_NCCL_ENABLE_TIMING": "1",  # also record each collective's start, hence its duration
}
#: The older names of two of them, still read by torch 2.13.
NCCL_OLDER_NAMES: dict[str, str] = {"TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
                                    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


def nccl_settings(prefix: str = NCCL_SETTINGS["TORCH_FR_DUMP_TEMP_FILE"], buffer_size: int = 2000) -> str:
    """The environment, as a shell prefix for ``torchrun``, that makes NCCL ranks record and dump on timeout."""
    if buffer_size <= 0:
        raise ValueError(f"buffer_size should be > 0 entries (0 turns the record off), got {buffer_size}")
    settings = NCCL_SETTINGS | {"TORCH_FR_BUFFER_SIZE": str(buffer_size), "TORCH_FR_DUMP_TEMP_FILE": prefix}
    return " ".join(f"{name}={value}" for name, value in settings.items())


@contextlib.contextmanager
def recording(buffer_size: int = 200) -> Iterator[None]:
    """Ranks started inside the block record their last ``buffer_size`` collectives (0 turns it off)."""
    if buffer_size < 0:
        raise ValueError(f"buffer_size should be >= 0 entries, got {buffer_size}")
    with environment.variables({BUFFER_ENV: str(buffer_size)}):
        yield


def dump(path: str | Path) -> Path:
    """Write this rank's flight record (JSON) to ``path`` now; return the path."""
    data = torch._C._distributed_c10d._dump_fr_trace_json(True, True)  # include collectives, only active ones
    Path(path).write_bytes(data if isinstance(data, bytes) else str(data).encode())
    return Path(path)


def dump_after(seconds: float, path: str | Path) -> threading.Timer:
    """Arm a background thread that dumps this rank's record to ``path`` after ``seconds`` (a daemon: it
    never keeps a finished rank alive)."""
    timer = threading.Timer(seconds, dump, args=(path,))
    timer.daemon = True
    timer.start()
    return timer


def entries(path: str | Path) -> list[dict]:
    """The collectives a rank entered, oldest first: ``{"seq", "op", "sizes"}`` each.

    (The dump's ``state`` and ``pg_status`` completion fields are filled lazily on gloo, so they are left out.)
    """
    record = json.loads(Path(path).read_text())
    return [{"seq": e["collective_seq_id"], "op": e["profiling_name"], "sizes": e["input_sizes"]}
            for e in record.get("entries", [])]
