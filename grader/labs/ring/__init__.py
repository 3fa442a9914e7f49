"""The ring lab, one folder: its check (``check.py``), the stub a student starts from (``stub.py``) and
the reference solution (``reference.py``)."""

from grader.labs.ring.check import LAB

__all__ = ["LAB"]
