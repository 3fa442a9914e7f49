"""The one record of a communication call, and where in the learner's code it came from.

:class:`Record` is what :mod:`course.runtime.observed` notes for every collective and message: the labs' logs
(:mod:`course.runtime.comm_log`, :mod:`course.runtime.recorder`), the grader's probes and NCCL's rules
(:mod:`course.runtime.nccl_rules`) all read this one type. :func:`locate` finds, from the stack, which
``torch.distributed`` function the code called (``isend``, ``all_gather_into_tensor``, ...) and the learner's line.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass

import torch

from course.runtime.collective_names import FUNCTIONS

TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_DISTRIBUTED = os.path.join(TORCH, "distributed") + os.sep
#: torch's files whose functions are the API a learner calls (and the logging wrapper around them)
API_FILES = {os.path.join(_DISTRIBUTED, name) for name in (
    "distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py")}
FUNCTIONAL = os.path.join(_DISTRIBUTED, "_functional_collectives.py")
_OPS = os.path.join(TORCH, "_ops.py")  # torch's operator dispatch, between a functional collective and its group
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the course's and the grader's own code: never "the learner's line"
OURS = tuple(os.path.join(_ROOT, name) + os.sep for name in ("course", "grader"))
#: files of ours written as a learner's: a lab's reference solution and stub, and the drills' planted bugs
#: (``course/practice/drills.py``, notebook 09)
LEARNER_FILES = ("reference.py", "stub.py", "drills.py")
#: the standard library's and the installed packages' code: never the learner's line either (a rank's outermost
#: frames are ``multiprocessing/process.py``'s)
_LIBRARIES = tuple({os.path.realpath(sysconfig.get_paths()[name]) + os.sep for name in ("stdlib", "purelib")}
                   | {sysconfig.get_paths()[name] + os.sep for name in ("stdlib", "purelib")})
_LAYER = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: frames between the learner's call and the group that are neither (the interceptor's wrappers, torch's dispatch)
_TRANSPARENT = {os.path.join(_LAYER, "intercept.py"), _OPS}


@dataclass
class Record:
    """One call a rank made on an observed process group. Times are ``time.perf_counter()`` seconds.

    Attributes:
        op: the canonical operation (:data:`course.runtime.collective_names.SENT`'s keys: ``all_gather``, ``send``).
        kind: ``"collective"`` or ``"p2p"``.
        api: what the code called: a ``torch.distributed`` function (``"all_gather_into_tensor"``, ``"isend"``; a
            ``batch_isend_irecv``'s messages are its ``isend``/``irecv``), ``"functional.all_reduce"``, or
            ``"ProcessGroup.send"`` for a group method called directly (the course's ``Comm``, DDP's reducer).
        method: the ``ProcessGroup`` method that ran (``"all_gather_single"``).
        group, group_size: the group's name and size.
        peer, tag: a message's peer (its rank in the default group) and tag; None for a collective.
        nbytes: bytes of this rank's input tensors; sent_bytes: what a ring algorithm sends from this rank for it.
        shapes, dtype: of the input tensors.
        where: ``"file.py:12"``, the learner's line: the first frame outside torch, the course and the grader.
        caller: the file that called into ``torch.distributed``; by_torch: that file is torch's (DDP, autograd).
        thread: the issuing thread's ident. start, end: when issued and when it returned; waited: when its work
            handle's ``wait()`` was first called (set by listeners that time it).
        async_op: the call returned a work handle to the code (``async_op=True``, a functional collective, a group
            method called directly); False when ``torch.distributed`` waited for it before returning.
        sent: a copy of what a send sent, kept only inside :func:`course.runtime.observed.keeping_sent` (the ring
            lab's drawing of the messages).
    """

    op: str
    kind: str
    api: str
    method: str
    group: str
    group_size: int
    peer: int | None
    tag: int | None
    nbytes: int
    sent_bytes: float
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    where: str
    caller: str
    by_torch: bool
    thread: int
    start: float
    end: float = float("nan")
    waited: float | None = None
    async_op: bool = True
    sent: torch.Tensor | None = None  # a send's tensor as it was sent, on the CPU: only inside observed.keeping_sent()

    def signature(self) -> str:
        """What every rank must agree on for a collective: ``"all_reduce float32[4, 3]"``."""
        shapes = " ".join(f"[{', '.join(map(str, shape))}]" for shape in self.shapes)
        return f"{self.op} {self.dtype}{shapes}"


def flatten(value: object) -> list[torch.Tensor]:
    """The tensors in ``value``: a tensor, or lists of lists of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in flatten(item)]
    return []


def _learners(path: str) -> bool:
    """``path`` is the learner's code: not torch's, the standard library's, the course's or the grader's (a lab's
    reference solution and stub, ``grader/labs/<lab>/reference.py``, and the drills are written as a learner's)."""
    if path.startswith(OURS):
        return os.path.basename(path) in LEARNER_FILES
    return not path.startswith((TORCH, "<frozen", *_LIBRARIES))


def locate(method: str) -> tuple[str, str, bool, str]:
    """``(api, caller, by_torch, where)`` of the call being made now (see :class:`Record`)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_LAYER) or frame.f_code.co_filename == _OPS):
        frame = frame.f_back
    outermost = innermost = ""
    functional = False
    while frame is not None and (frame.f_code.co_filename in API_FILES or frame.f_code.co_filename in _TRANSPARENT):
        name = frame.f_code.co_name
        if frame.f_code.co_filename in _TRANSPARENT:
            frame = frame.f_back
            continue
        if frame.f_code.co_filename == FUNCTIONAL and not name.startswith("_"):
            outermost, functional = f"functional.{name}", True
        elif name in FUNCTIONS and not functional:
            outermost, innermost = name, innermost or name
        frame = frame.f_back
    api = innermost if outermost == "batch_isend_irecv" else outermost or f"ProcessGroup.{method}"
    caller = frame.f_code.co_filename if frame is not None else ""
    while frame is not None and not _learners(frame.f_code.co_filename):
        frame = frame.f_back
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
    return api, caller, caller.startswith(TORCH), where
