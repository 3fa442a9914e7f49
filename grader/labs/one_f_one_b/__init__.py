"""The one_f_one_b lab, one folder: its check (``check.py``), the stub a student starts from (``stub.py``) and
the reference solution (``reference.py``)."""

from grader.labs.one_f_one_b.check import LAB

__all__ = ["LAB"]
