"""Old import paths of the grader's modules, kept working for one release with a DeprecationWarning.

``import grader.sandbox_bwrap``, ``from grader import probes`` and ``from grader.records import parse`` still
work: :class:`MovedFinder` (installed on ``sys.meta_path`` by ``grader/__init__.py``) answers an old name with
the module at its new path, after warning which path to import instead. Remove this module, and its line in
``grader/__init__.py``, in the release after the move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {  # old name under grader -> new name under grader
    "sandbox_bwrap": "sandbox.bubblewrap",
    "sandbox_exec": "sandbox.exec",
    "sandbox_namespaces": "sandbox.namespaces",
    "sandbox_uid": "sandbox.uid",
    "launcher": "inrank.launcher",
    "harness": "inrank.harness",
    "probes": "inrank.probes",
    "channel": "inrank.channel",
    "records": "inrank.records",
    "fingerprints": "inrank.fingerprints",
    "probed_data": "inrank.probed_data",
    "reports": "render",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path (one module object under both names)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} has moved to {self.new}: import {self.new} instead (the old path goes in the "
                      "next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # already executed; the import system set the old name's spec on it


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds ``grader.<old name>`` for every old name in :data:`MOVED`; nothing else."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != "grader" or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"grader.{MOVED[name]}"))


def install() -> None:
    """Put :class:`MovedFinder` first on ``sys.meta_path`` (once): before any finder that could still find a
    stale copy of an old module (an old installation's file)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
