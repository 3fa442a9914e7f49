"""The fsdp lab, one folder: its check (``check.py``), the stub a student starts from (``stub.py``) and
the reference solution (``reference.py``)."""

from grader.labs.fsdp.check import LAB

__all__ = ["LAB"]
