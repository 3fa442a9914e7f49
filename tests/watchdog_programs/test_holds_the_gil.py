"""A test that hangs holding the GIL (run by tests/test_watchdog.py in its own pytest, never collected here)."""

import ctypes

import pytest


@pytest.mark.timeout(2)
def test_sleeps_holding_the_gil():
    ctypes.PyDLL(None).sleep(600)  # a PyDLL call keeps the GIL: pytest-timeout's thread can never run
