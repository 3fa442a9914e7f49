"""The tp_mlp lab, one folder: its check (``check.py``), the stub a student starts from (``stub.py``) and
the reference solution (``reference.py``)."""

from grader.labs.tp_mlp.check import LAB

__all__ = ["LAB"]
