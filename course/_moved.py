"""Where the modules moved (issue 21), and what keeps the old import paths working for one release.

``course.allreduce`` is now ``course.collectives.allreduce``. A notebook saved with the old path still runs:
``import course.allreduce``, ``from course.allreduce import ring_allreduce`` (a finder on ``sys.meta_path``) and
``from course import allreduce`` (:func:`course.__getattr__`) return the new module and warn once, with a
``DeprecationWarning`` that names the new path. ``course.ddp``, ``course.monitor`` and ``course.model_parallel``
are folders now; what their old modules defined is forwarded by the folder's ``__getattr__`` (:func:`forward`).
Remove this module, the finder and the forwards in the release after next.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from types import ModuleType
from typing import Any

# old name under course -> new dotted path under course
MOVED: dict[str, str] = {
    "validation": "arguments",
    "predict": "quiz",
    "root_cause": "runtime.root_cause",
    "gradient_descent": "optimization.gradient_descent",
    "linear_neuron": "optimization.linear_neuron",
    "convergence": "optimization.convergence",
    "throughput": "optimization.throughput",
    "large_batch": "optimization.large_batch",
    "noise_scale": "optimization.noise_scale",
    "lr_scaling": "optimization.lr_scaling",
    "batch_sweep": "optimization.batch_sweep",
    "lars": "optimization.lars",
    "batch_plots": "optimization.batch_plots",
    "naive_data_parallel": "naive.naive_data_parallel",
    "who_works": "naive.who_works",
    "parameter_server": "naive.parameter_server",
    "staleness": "naive.staleness",
    "input_pipeline": "naive.input_pipeline",
    "model_parallel": "model_parallel.two_stage",
    "pipeline_bubble": "model_parallel.bubble",
    "allreduce": "collectives.allreduce",
    "allreduce_protocol": "collectives.protocol",
    "allreduce_sim": "collectives.simulation",
    "allreduce_timing": "collectives.timing_ranks",
    "cost_model": "collectives.cost_model",
    "hierarchical": "collectives.hierarchical",
    "shm_allreduce": "collectives.shm_allreduce",
    "shm_group": "collectives.shm_group",
    "ring_lesson": "collectives.ring_lesson",
    "buckets": "ddp.buckets",
    "distributed_optimizer": "ddp.distributed_optimizer",
    "horovod": "ddp.horovod",
    "overlap": "ddp.overlap",
    "conversion_accuracy": "ddp.conversion_accuracy",
    "calibration": "ddp.calibration",
    "scaling": "ddp.scaling",
    "ddp": "ddp.internals",
    "ddp_scripts": "ddp.scripts",
    "ddp_hooks": "ddp.hooks",
    "nodes": "multinode.nodes",
    "netns": "multinode.netns",
    "perf_model": "perf.model",
    "hardware": "perf.catalog",
    "workloads": "perf.workloads",
    "perf_validation": "perf.published",
    "monitor": "monitor.watch",
    "monitor_views": "monitor.views",
    "monitor_report": "monitor.summary_plot",
    "utilization": "monitor.sampling",
    "utilization_sources": "monitor.sources",
    "utilization_summary": "monitor.summary",
    "memory_budget": "memory.budget",
    "memory_measure": "memory.measure",
    "activations": "memory.activations",
    "resnet": "memory.resnet",
    "memory_fit": "memory.fit",
    "memory_report": "memory.tables",
    "sharding": "memory.sharding",
}

_HERE = os.path.dirname(os.path.abspath(__file__))


def _internal(filename: str) -> bool:
    """A frame the warning should not be blamed on: this package's forwarding code, or the import system."""
    if "importlib" in filename:
        return True
    return os.path.abspath(filename) == os.path.abspath(__file__) or (
        filename.startswith(_HERE) and filename.endswith("__init__.py"))


def warn_moved(old: str, new: str) -> None:
    """Warn, from the caller's line (the notebook cell), that ``old`` moved to ``new``."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and (_internal(frame.f_code.co_filename) or frame.f_code.co_name == "__getattr__"):
        if "_bootstrap" not in frame.f_code.co_filename:
            level += 1
        frame = frame.f_back
    warnings.warn(f"{old} moved to {new}; use {new} instead (the old path goes in the next release)",
                  DeprecationWarning, stacklevel=level)


def folder_names() -> set[str]:
    """Old module names that are now folders: they import as the folder and forward the rest."""
    return {old for old, new in MOVED.items() if new.startswith(old + ".")}


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same module object, not a copy)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """A placeholder module: :meth:`exec_module` swaps it for the real one."""

    def exec_module(self, module: ModuleType) -> None:
        """Put the module at the new path in ``sys.modules`` under the old name (the import system returns it)."""
        warn_moved(module.__name__, self.new)
        sys.modules[module.__name__] = importlib.import_module(self.new)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds ``course.<old>`` for every old name that is not a folder now."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.partition(".")
        if package != "course" or old not in MOVED or old in folder_names():
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias("course." + MOVED[old]))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


def from_course(name: str) -> ModuleType:
    """``from course import <old>``: the module at its new path, with the warning; AttributeError otherwise."""
    if name not in MOVED or name in folder_names():
        raise AttributeError(f"module 'course' has no attribute {name!r}")
    return importlib.import_module(f"course.{name}")


def forward(folder: str, name: str) -> Any:
    """``course.<folder>.<name>`` where ``<name>`` was defined by the old module ``course/<folder>.py``."""
    if name.startswith("__") or importlib.util.find_spec(f"course.{folder}.{name}") is not None:
        raise AttributeError(f"module 'course.{folder}' has no attribute {name!r}")
    new = "course." + MOVED[folder]
    value = getattr(importlib.import_module(new), name, None)
    if value is None:
        raise AttributeError(f"module 'course.{folder}' has no attribute {name!r}")
    warn_moved(f"course.{folder}.{name}", f"{new}.{name}")
    return value
