"""Environment variables set for the processes started inside a block, and restored after it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def variables(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set each variable of ``values`` in this process's environment (``None``: unset it) for the ``with`` block.

    After the block every variable is as it was, set or unset, even if the block raised.
    """
    before = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            _set(name, value)
        yield
    finally:
        for name, value in before.items():
            _set(name, value)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
