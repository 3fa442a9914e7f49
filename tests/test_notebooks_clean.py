"""Notebooks are committed clean: no outputs except the expected output of cells tagged ``nbval-check-output``.

The tag is cell metadata (nbval reads it like its ``# NBVAL_CHECK_OUTPUT`` comment), so a learner's cell carries no
test marker in its source.

A contributor refreshes them with::

    .venv/bin/python tests/test_notebooks_clean.py notebooks/NN_name.ipynb   # execute, then keep only checked outputs
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CHECK_TAG = "nbval-check-output"
#: nbval's comment markers: test machinery that a learner would read in the cell.
MARKERS = ("# NBVAL_", "#NBVAL_", "# PYTEST_VALIDATE")

pytestmark = pytest.mark.unit0


def is_checked(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and CHECK_TAG in cell.metadata.get("tags", [])


def clean(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop outputs and execution counts, except the expected output of checked cells, and saved widget state.

    nbval compares only cells that look run, so a checked cell keeps an execution count (always 1, so that
    refreshing a notebook changes nothing but real output).
    """
    notebook.metadata.pop("widgets", None)  # thousands of lines of live-monitor state, stale once saved
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        cell.execution_count = 1 if is_checked(cell) else None
        if not is_checked(cell):
            cell.outputs = []
    return notebook


def refresh(path: Path) -> None:
    """Execute a notebook top to bottom, then save it clean."""
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    nbformat.write(clean(notebook), path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path):
    notebook = nbformat.read(path, as_version=4)
    dirty = [i for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and (cell.outputs and not is_checked(cell))]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; run `python tests/{Path(__file__).name} {path}`"
    unfilled = [i for i, cell in enumerate(notebook.cells)
                if is_checked(cell) and not (cell.outputs and cell.execution_count)]
    assert not unfilled, f"{path.name}: checked cells {unfilled} have no expected output; refresh the notebook"
    assert "widgets" not in notebook.metadata, f"{path.name} carries saved widget state; refresh the notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_learner_cell_carries_a_test_marker(path):
    marked = [i for i, cell in enumerate(nbformat.read(path, as_version=4).cells) if cell.cell_type == "code"
              and any(line.lstrip().startswith(MARKERS) for line in cell.source.splitlines())]
    assert not marked, (f"{path.name}: cells {marked} carry an nbval comment; tag the cell instead "
                        f"(metadata tags: [\"{CHECK_TAG}\"], or nbval-ignore-output, nbval-skip, raises-exception)")


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        refresh(Path(argument))
        print(f"refreshed {argument}")
