"""The ddp lab, one folder: its check (``check.py``), the stub a student starts from (``stub.py``) and
the reference solution (``reference.py``)."""

from grader.labs.ddp.check import LAB

__all__ = ["LAB"]
