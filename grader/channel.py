"""The result channel: signed JSON lines from the trusted probes to the grader, never pickle.

Each rank's probes write records to an inherited pipe; the grader reads them on the other end. A record
is accepted only with a valid HMAC-SHA256 under a key made fresh for each run and handed to the probes on
a separate descriptor that is read and closed before the student's code starts. So text the student's
code writes to the pipe (or prints to look like a record) is rejected, never believed. Records are plain
JSON: reading them cannot run code. Used by the grader of notebook 06.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from typing import Any, BinaryIO

KEY_BYTES = 32


def new_key() -> bytes:
    """A fresh random key for one grading run."""
    return secrets.token_bytes(KEY_BYTES)


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def seal(key: bytes, record: dict[str, Any]) -> bytes:
    """One record as a signed JSON line: ``{"body": <record as JSON text>, "mac": <hex>}`` + newline."""
    body = json.dumps(record, separators=(",", ":"), allow_nan=True)
    return json.dumps({"body": body, "mac": _mac(key, body.encode())}).encode() + b"\n"


def unseal(key: bytes, line: bytes) -> dict[str, Any] | None:
    """The record in a signed line, or None if the line is malformed or its signature is wrong."""
    try:
        outer = json.loads(line)
        body, mac = outer["body"], outer["mac"]
        if not (isinstance(body, str) and isinstance(mac, str)):
            return None
        if not hmac.compare_digest(_mac(key, body.encode()), mac):
            return None
        record = json.loads(body)
    except (ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record, dict) else None


class Writer:
    """Signs records and writes them, whole lines only, to a pipe descriptor (thread-safe)."""

    def __init__(self, fd: int, key: bytes) -> None:
        self._fd, self._key, self._lock = fd, key, threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        data = seal(self._key, record)
        with self._lock:
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
    """Reads signed lines from a pipe on a thread; keeps the good records and counts the rejected ones."""

    def __init__(self, stream: BinaryIO, key: bytes) -> None:
        self.records: list[dict[str, Any]] = []
        self.rejected = 0
        self._stream, self._key = stream, key
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._stream:
            for line in self._stream:
                record = unseal(self._key, line)
                if record is None:
                    self.rejected += 1
                else:
                    self.records.append(record)

    def result(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """All records, once the writers have closed the pipe (or after ``timeout_s``)."""
        self._thread.join(timeout=timeout_s)
        return list(self.records)
