"""The root cause of a failed ``torchrun`` run: which rank failed first, and its own traceback.

When one rank of a ``torchrun`` job raises, the others fail a moment later in their next collective
("Connection closed by peer"), and torchrun adds its own ``ChildFailedError`` traceback at the end. The error
to read is the first rank's. torchrun prefixes each rank's stderr lines with ``[rankN]:`` and names the
"Root Cause (first observed failure)" in its summary; :func:`root_cause` reads both. Shown in
``notebooks/06_assignment.ipynb`` (the run cell).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANK_LINE = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")
_SUMMARY_RANK = re.compile(r"Root Cause \(first observed failure\):.*?^\s*rank\s*:\s*(\d+)", re.S | re.M)
TRACEBACK = "Traceback (most recent call last):"  # the first line of every Python traceback
_TORCHRUN_LOG = re.compile(r"^([IWEF]\d{4} |\*{5,}|Setting OMP_NUM_THREADS)")  # its glog lines and OMP banner
#: How a rank's error ends when it only lost a peer (gloo, NCCL): the echo of another rank's failure, not a cause.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused",
             "Socket Timeout", "remote process exited", "NCCL communicator was aborted", "DistNetworkError")
_ECHOES = (*PEER_LOST, "ChildFailedError", "Signal 15 (SIGTERM)")  # and torchrun's own report of the failure


@dataclass(frozen=True)
class RootCause:
    """The rank that failed first (``None`` if the output does not say) and its traceback, unprefixed."""

    rank: int | None
    traceback: str

    @property
    def error(self) -> str:
        """The traceback's last line: the exception and its message."""
        return self.traceback.strip().splitlines()[-1] if self.traceback.strip() else ""


def root_cause(stderr: str, max_lines: int = 30) -> RootCause | None:
    """The first failing rank and its own traceback (its last ``max_lines`` lines), read from torchrun's stderr.

    The rank is the one torchrun's summary names as the first observed failure, unless that rank only echoes
    another's failure ("Connection closed by peer") while another rank raised something else. Output without
    ``[rankN]:`` prefixes (one process, or an older torchrun) gives its last traceback that is not torchrun's.

    Returns:
        a :class:`RootCause`, or ``None`` when ``stderr`` holds no traceback at all.
    """
    per_rank: dict[int, list[str]] = {}
    for line in stderr.splitlines():
        match = _RANK_LINE.match(line)
        if match:
            per_rank.setdefault(int(match.group(1)), []).append(match.group(2))
    tracebacks = {rank: _last_traceback(lines, max_lines) for rank, lines in per_rank.items()}
    tracebacks = {rank: text for rank, text in tracebacks.items() if text}
    if not tracebacks:
        unprefixed = [t for t in _tracebacks(stderr.splitlines()) if not _is_echo(t)]
        return RootCause(None, trim(unprefixed[-1], max_lines)) if unprefixed else None
    causes = [rank for rank, text in tracebacks.items() if not _is_echo(text)]  # in order of first appearance
    summary = _SUMMARY_RANK.search(stderr)
    named = int(summary.group(1)) if summary else None
    rank = named if named in tracebacks and (named in causes or not causes) else (causes or list(tracebacks))[0]
    return RootCause(rank, tracebacks[rank])


def explain(returncode: int, stdout: str, stderr: str, stdout_chars: int = 2000) -> str:
    """What to show after a run: the end of its output and, if it failed, the first failing rank's traceback.

    Takes the fields of a ``subprocess.CompletedProcess`` or a :class:`course.monitor.watch.WatchedRun`.
    """
    parts = [stdout[-stdout_chars:].rstrip()] if stdout.strip() else []
    if returncode == 0:
        return "\n".join(parts) or "(the run printed nothing)"
    cause = root_cause(stderr)
    if cause is None:  # e.g. sys.exit("message"): what the script wrote, without torchrun's own report
        tail = "\n".join((_script_lines(stderr) or stderr.strip().splitlines())[-20:])
        parts.append(f"exit code {returncode}, and no Python traceback; the end of its stderr:\n{tail}"
                     if tail else f"exit code {returncode}, and nothing on stderr.")
    else:
        who = f"rank {cause.rank} failed first" if cause.rank is not None else "it failed"
        parts.append(f"exit code {returncode}: {who}. Its traceback (the other ranks' errors followed from it):\n"
                     f"{cause.traceback}")
    return "\n".join(parts)


def _script_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that the script wrote: without torchrun's logs, banner and ChildFailedError report."""
    lines = stderr.splitlines()
    for start in (i for i, line in enumerate(lines) if line.startswith(TRACEBACK)):
        if any("ChildFailedError" in line for line in lines[start:start + 60] if line and not line[0].isspace()):
            lines = lines[:start]
            break
    return [line for line in lines if line.strip() and not _TORCHRUN_LOG.match(line)]


def _tracebacks(lines: list[str]) -> list[str]:
    """Every traceback in ``lines``: from its header to the first unindented line after it, inclusive."""
    found, current = [], None
    for line in lines:
        if line.startswith(TRACEBACK):
            current = [line]
        elif current is not None:
            current.append(line)
            if line and not line[0].isspace():
                found.append("\n".join(current))
                current = None
    if current:
        found.append("\n".join(current))
    return found


def _last_traceback(lines: list[str], max_lines: int) -> str:
    found = _tracebacks(lines)
    return trim(found[-1], max_lines) if found else ""


def trim(traceback: str, max_lines: int) -> str:
    """``traceback`` if it has at most ``max_lines`` lines, else its first line and its last ``max_lines - 1``,
    with a line between saying how many were left out (the grader's crash report uses it too:
    :func:`grader.crashes.trimmed_traceback`)."""
    lines = traceback.splitlines()
    if len(lines) <= max_lines:
        return traceback
    return "\n".join([lines[0], f"  ... ({len(lines) - max_lines} lines not shown)", *lines[-(max_lines - 1):]])


def _is_echo(traceback: str) -> bool:
    last = traceback.strip().splitlines()[-1] if traceback.strip() else ""
    return any(echo in last for echo in _ECHOES)
