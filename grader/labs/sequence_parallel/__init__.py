"""The sequence_parallel lab, one folder: its check (``check.py``), the stub a student starts from (``stub.py``) and
the reference solution (``reference.py``)."""

from grader.labs.sequence_parallel.check import LAB

__all__ = ["LAB"]
