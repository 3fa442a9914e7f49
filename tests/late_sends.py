"""The pipeline-runner checker's old design, kept to show that NCCL's rules catch it
(tests/grader/labs/test_pipeline_runner.py): every ``isend`` issued 50 ms late by a second thread. On NCCL that is
one communicator used from two threads, and sends reordered against the receives.

The rank function :func:`late_sends_run` runs the lab's reference solution under it on a launched rank.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch.distributed as dist

DELAY_S = 0.05


class _Request:
    """What the student's ``irecv`` returns: the real request, and whether the student waited it."""

    def __init__(self, request: Any = None) -> None:
        self.request, self.waited = request, False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        self.waited = True
        return self.request.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return self.request.is_completed()


class _LateRequest(_Request):
    """What the student's ``isend`` returns: ``wait()`` waits until the send was issued, then for the send."""

    def __init__(self) -> None:
        super().__init__()
        self.issued = threading.Event()

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        self.issued.wait()
        return super().wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return self.issued.is_set() and self.request.is_completed()


class LateSends:
    """While active, ``dist.isend`` is issued ``DELAY_S`` late, in order, by one thread; ``calls`` records
    ``(name, peer)`` of every ``isend`` and ``irecv``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.requests: list[_Request] = []  # in the order of calls
        self._queue: queue.Queue = queue.Queue()
        self._isend, self._irecv = dist.isend, dist.irecv

    def __enter__(self) -> LateSends:
        self._thread = threading.Thread(target=self._issue, daemon=True)
        self._thread.start()
        dist.isend, dist.irecv = self._late_isend, self._recorded_irecv
        return self

    def __exit__(self, *exc: object) -> None:
        dist.isend, dist.irecv = self._isend, self._irecv
        self._queue.put(None)
        self._thread.join()

    def _late_isend(self, tensor: Any, dst: int | None = None, *args: Any, **kwargs: Any) -> _LateRequest:
        self.calls.append(("isend", dst if dst is not None else kwargs.get("dst", -1)))
        late = _LateRequest()
        self.requests.append(late)
        self._queue.put((time.monotonic() + DELAY_S, late, tensor, dst, args, kwargs))
        return late

    def _recorded_irecv(self, tensor: Any, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("irecv", src if src is not None else kwargs.get("src", -1)))
        self.requests.append(_Request(self._irecv(tensor, src, *args, **kwargs)))
        return self.requests[-1]

    def unwaited(self) -> list[int]:
        """Indices (into ``calls``) of the requests the student never waited; each is waited here, so none hangs."""
        missed = [index for index, request in enumerate(self.requests) if not request.waited]
        for index in missed:
            self.requests[index].wait()
        return missed

    def _issue(self) -> None:
        while (item := self._queue.get()) is not None:
            at, late, tensor, dst, args, kwargs = item
            time.sleep(max(0.0, at - time.monotonic()))
            late.request = self._isend(tensor, dst, *args, **kwargs)
            late.issued.set()




def late_sends_run(reference: str, micro_batches: int) -> None:
    """On a launched rank: the reference run_stage with every isend issued late from a second thread."""
    from course.model_parallel import pipeline, schedules, transformer
    from grader.labs.core import load_entry

    rank, p = dist.get_rank(), dist.get_world_size()
    config = transformer.Config(d_model=16, num_heads=2, d_ff=32, seq_len=8, num_layers=p)
    inputs, targets = transformer.sample_batch(config, micro_batches, 0)
    stage = pipeline.split(transformer.build(config, 0), p)[rank]
    micro_inputs, micro_targets = list(inputs.chunk(micro_batches)), list(targets.chunk(micro_batches))
    ops = [(op.kind, op.micro_batch) for op in schedules.one_f_one_b(p, micro_batches, rank)]
    shape = (len(micro_inputs[0]), config.seq_len, config.d_model)
    run_stage = load_entry(reference, "run_stage")
    with LateSends() as sends:
        run_stage(stage, ops, micro_inputs, lambda out, i: transformer.loss(out, micro_targets[i]) / micro_batches,
                  shape)
        sends.unwaited()
