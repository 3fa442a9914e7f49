"""Each lab's %%writefile cell, in the notebook that introduces it, writes exactly the packaged stub."""

import os

import nbformat
import pytest

from course.labs import LABS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _writefile_cells(lab) -> list[str]:
    notebook = nbformat.read(os.path.join(ROOT, "notebooks", f"{lab.notebook}.ipynb"), as_version=4)
    header = f"%%writefile {lab.student_file}\n"
    return [cell.source[len(header):] for cell in notebook.cells
            if cell.cell_type == "code" and cell.source.startswith(header)]


@pytest.mark.parametrize("name", ["ddp", "zero"])
def test_the_notebooks_writefile_cell_is_the_packaged_stub(name):
    lab = LABS[name]
    with open(os.path.join(ROOT, "course", "labs", "stubs", os.path.basename(lab.student_file))) as handle:
        stub = handle.read()
    cells = _writefile_cells(lab)
    assert len(cells) == 1, f"{lab.notebook} should have one %%writefile {lab.student_file} cell, has {len(cells)}"
    assert cells[0].rstrip("\n") == stub.rstrip("\n")


@pytest.mark.parametrize("name", ["ddp", "zero"])
def test_the_notebook_checks_the_file_it_wrote(name):
    lab = LABS[name]
    notebook = nbformat.read(os.path.join(ROOT, "notebooks", f"{lab.notebook}.ipynb"), as_version=4)
    call = f'labs.check("{name}", "{lab.student_file}")'
    assert any(call in cell.source for cell in notebook.cells if cell.cell_type == "code")
