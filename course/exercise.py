"""What every exercise checker does with the student's function before it checks anything.

A stub raises ``NotImplementedError`` until the student writes it, and a wrong attempt may raise anything:
neither may stop the notebook (a student who skips an exercise is not blocked), and both get feedback in the
course's terms instead of a traceback. :func:`checker` wraps a checker that prints its verdict and returns
True, returns False, or raises ``AssertionError`` naming the first case that differs; the wrapped checker
always prints one verdict and returns a bool. Every exercise checker of notebooks 01-05 uses it; solutions
live in ``notebooks/solutions/`` and ``tests/test_exercises.py`` proves each checker fails the stub and passes
the solution.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

NOT_ATTEMPTED = ("Not attempted yet: the function still raises NotImplementedError. Replace the raise with your "
                 "code, then run this check again.")


def checker(check: Callable[..., bool | None]) -> Callable[..., bool]:
    """Wrap an exercise checker: stubs and errors become printed feedback, the verdict a bool."""

    @functools.wraps(check)
    def wrapped(candidate: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        if not callable(candidate):
            print(f"Not yet: expected the function you wrote, got {type(candidate).__name__} {candidate!r}.")
            return False
        try:
            return check(candidate, *args, **kwargs) is not False
        except NotImplementedError:
            print(NOT_ATTEMPTED)
        except AssertionError as failure:
            print(f"Not yet: {failure}")
        except Exception as error:  # noqa: BLE001 - the student's code raised it; it is the feedback
            print(f"Not yet: your function raised {type(error).__name__}: {error}")
        return False

    return wrapped
