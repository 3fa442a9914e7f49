"""PLACEHOLDER until labs-core's driver is merged: the dataclasses of LABS_CONTRACT.md only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    points: int
    hidden: bool = False


@dataclass(frozen=True)
class Finding:
    check: str
    passed: bool
    message: str


@dataclass(frozen=True)
class Lab:
    name: str
    title: str
    notebook: str
    student_file: str
    entry: str
    checks: tuple[Check, ...]
    rank_check: str
    runs: tuple[dict, ...]
    hidden_runs: tuple[dict, ...] = ()
