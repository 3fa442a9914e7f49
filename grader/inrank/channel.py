"""The result channel: signed JSON lines from the trusted probes to the grader, never pickle.

Each rank's probes write records to an inherited pipe; the launcher relays them, adds its own records
(exit codes, output), and the grader reads them on the other end. A record is accepted only with a valid
HMAC-SHA256 and the next sequence number of its signer. The launcher signs with a key made fresh for each
run; rank ``r`` gets only :func:`rank_key` of it, on a separate descriptor that is read and closed before
the student's code starts, and the signing object keeps no copy of the key a Python program could read.
So: text written straight to the pipe (or printed to look like a record) is rejected; a rank cannot sign
the launcher's records (exit codes, output sizes) or another rank's; a record slipped between the
writer's own ones breaks the sequence.

The launcher makes itself not dumpable (:func:`hide_memory`), so the ranks, which run as its user, cannot
read the run's key out of its memory (``/proc/<pid>/mem``).

What this does *not* do: code running in a rank's process can still reach that rank's writer (through
``gc``, say) and sign records as that rank. The probes refuse calls that do not come from the grader's
own modules and report them as forgeries, but a determined submission can get around that too. That is
why the grader never relies on a rank's record alone where it can check it against what it measured
outside the student's processes: the checkpoint it evaluates itself, the replay of the first steps, the
launcher's exit records. Records are plain JSON: reading them cannot run code.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
from typing import Any, BinaryIO

KEY_BYTES = 32
LAUNCHER = "launcher"  # the signer of records the launcher writes itself
PR_SET_DUMPABLE = 4  # prctl option, <linux/prctl.h>


def hide_memory() -> bool:
    """Make this process's memory unreadable to the other processes of its user: not dumpable, so
    ``/proc/<pid>/mem``, ``ptrace`` and core dumps are refused to them (only a privileged process gets in).

    For the process holding the run's key (the launcher): the ranks it starts run as the same user and could
    otherwise read the key out of its memory and sign records as the launcher. An ``exec`` makes a process
    dumpable again, so the ranks themselves are unaffected. Returns False where this is not possible (not
    Linux); the key is then readable by same-user processes (see docs/instructors.md, the threat model).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def new_key() -> bytes:
    """A fresh random key for one grading run."""
    return secrets.token_bytes(KEY_BYTES)


def rank_key(key: bytes, rank: int) -> bytes:
    """The key rank ``rank`` signs with: derived from the run's key, useless for signing as anyone else."""
    return hmac.new(key, f"multigpu-course rank {rank}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def seal(key: bytes, record: dict[str, Any]) -> bytes:
    """One record as a signed JSON line: ``{"body": <record as JSON text>, "mac": <hex>}`` + newline."""
    body = json.dumps(record, separators=(",", ":"), allow_nan=True)
    return json.dumps({"body": body, "mac": _mac(key, body.encode())}).encode() + b"\n"


def _parse(line: bytes) -> tuple[str, str, dict[str, Any]] | None:
    try:
        outer = json.loads(line)
        body, mac = outer["body"], outer["mac"]
        if not (isinstance(body, str) and isinstance(mac, str)):
            return None
        record = json.loads(body)
    except (ValueError, KeyError, TypeError):
        return None
    return (body, mac, record) if isinstance(record, dict) else None


def unseal(key: bytes, line: bytes) -> dict[str, Any] | None:
    """The record in a signed line, or None if the line is malformed or its signature is wrong."""
    parsed = _parse(line)
    if parsed is None or not hmac.compare_digest(_mac(key, parsed[0].encode()), parsed[1]):
        return None
    return parsed[2]


def signer(key: bytes, line: bytes) -> tuple[dict[str, Any], str | int] | None:
    """The record in a line and who signed it: :data:`LAUNCHER`, or the rank it names; None if neither."""
    parsed = _parse(line)
    if parsed is None:
        return None
    body, mac, record = parsed
    if hmac.compare_digest(_mac(key, body.encode()), mac):
        return record, LAUNCHER
    rank = record.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 4096 \
            and hmac.compare_digest(_mac(rank_key(key, rank), body.encode()), mac):
        return record, rank
    return None


class Writer:
    """Signs records and writes them, whole lines only, to a pipe (thread-safe).

    Records are numbered 0, 1, 2, ... in ``seq``, separately for each ``rank`` they name (the launcher
    writes one exit record per rank).

    When ``callers`` (source file paths) is given, only code in those files may write; a call from
    anywhere else is not written as asked but reported, as a ``forgery`` record naming the caller.

    Only the process that made the writer writes: in a forked child (a DataLoader worker, a subprocess
    started with fork) :meth:`write` does nothing, so a child can neither take its parent's next sequence
    number (which would get the parent's own next record refused) nor speak for it.
    """

    def __init__(self, fd: int, key: bytes, callers: tuple[str, ...] = ()) -> None:
        self._hmac = hmac.new(key, digestmod=hashlib.sha256)  # keyed state, not the key
        self._callers = frozenset(os.path.abspath(c) for c in callers)
        self._fd, self._seq, self._lock = fd, {}, threading.Lock()
        self._pid = os.getpid()

    def write(self, record: dict[str, Any]) -> None:
        if os.getpid() != self._pid:  # a forked child: its parent's records are not its to write
            return
        caller = os.path.abspath(sys._getframe(1).f_code.co_filename)
        if self._callers and caller not in self._callers:
            record = {"kind": "forgery", "rank": record.get("rank"), "via": "channel.Writer.write",
                      "caller": str(caller), "forged_kind": str(record.get("kind"))}
        with self._lock:
            seq = self._seq.get(record.get("rank"), 0)
            self._seq[record.get("rank")] = seq + 1
            body = json.dumps({**record, "seq": seq}, separators=(",", ":"), allow_nan=True)
            mac = self._hmac.copy()
            mac.update(body.encode())
            data = json.dumps({"body": body, "mac": mac.hexdigest()}).encode() + b"\n"
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]


def read_key(fd: int) -> bytes:
    """Read the run's key from ``fd`` (until EOF) and close it.

    Raises:
        RuntimeError: the descriptor did not hold a whole key.
    """
    chunks = []
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(KEY_BYTES):
            chunks.append(chunk)
    key = b"".join(chunks)
    if len(key) != KEY_BYTES:
        raise RuntimeError(f"grader key descriptor held {len(key)} bytes, expected {KEY_BYTES}")
    return key


def key_pipe(key: bytes) -> int:
    """A pipe already holding ``key``, write end closed: returns the read end to hand to a child."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, key)
    os.close(write_fd)
    return read_fd


class Reader:
    """Reads signed lines from a pipe on a thread; keeps the good records and counts the bad ones.

    Each kept record gains ``"signer"``: :data:`LAUNCHER` or the rank whose key signed it. ``rejected``
    counts the lines refused: with no valid signature, or (also counted in ``out_of_sequence``) signed but
    not numbered next in their stream (a record replayed, or signed outside the writer). A stream is one
    signer's records about one rank: the launcher's exit records, or one rank's own.
    """

    def __init__(self, stream: BinaryIO, key: bytes) -> None:
        self.records: list[dict[str, Any]] = []
        self.rejected = 0
        self.out_of_sequence = 0
        self._next: dict[tuple, int] = {}
        self._stream, self._key = stream, key
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._stream:
            for line in self._stream:
                opened = signer(self._key, line)
                if opened is None:
                    self.rejected += 1
                    continue
                record, who = opened
                stream = (who, record.get("rank"), record.get("kind") == "rank_exit")
                if record.get("seq") != self._next.get(stream, 0):
                    self.rejected += 1
                    self.out_of_sequence += 1
                    continue
                self._next[stream] = record["seq"] + 1
                self.records.append({**record, "signer": who})

    def result(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """All records, once the writers have closed the pipe (or after ``timeout_s``)."""
        self._thread.join(timeout=timeout_s)
        return list(self.records)
