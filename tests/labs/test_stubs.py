"""Every registered lab is one folder, and is introduced in its notebook: a %%writefile cell holding exactly the
packaged stub, then a check cell calling course.labs.check on that file."""

import os
from pathlib import Path

import nbformat
import pytest

from grader.labs import LABS
from grader.labs.core import folder, reference_path, stub_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("name", sorted(LABS))
def test_the_notebook_writes_the_stub_then_checks_it(name):
    lab = LABS[name]
    notebook = nbformat.read(os.path.join(ROOT, "notebooks", f"{lab.notebook}.ipynb"), as_version=4)
    sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    header = f"%%writefile {lab.student_file}\n"
    written = [i for i, source in enumerate(sources) if source.startswith(header)]
    assert len(written) == 1, f"{lab.notebook} should write {lab.student_file} in one cell"
    with open(stub_path(lab)) as handle:
        assert sources[written[0]][len(header):].rstrip("\n") == handle.read().rstrip("\n")
    assert f'labs.check("{name}", "{lab.student_file}")' in sources[written[0] + 1]


@pytest.mark.parametrize("name", sorted(LABS))
def test_each_lab_is_one_folder_with_its_check_stub_and_reference(name):
    lab = LABS[name]
    assert folder(lab) == Path(ROOT, "grader", "labs", name)
    assert stub_path(lab).is_file() and reference_path(lab).is_file() and (folder(lab) / "check.py").is_file()
    assert os.path.isdir(os.path.join(ROOT, "notebooks", os.path.dirname(LABS[name].student_file)))


@pytest.mark.parametrize("name", sorted(LABS))
def test_the_labs_readme_lists_each_lab_with_its_grader_check_line(name):
    with open(os.path.join(ROOT, "notebooks", "labs", "README.md")) as handle:
        readme = handle.read()
    lab = LABS[name]
    assert f"| `{name}` |" in readme and f"`grader check {name} {lab.student_file}`" in readme
    assert f"`grader/labs/{name}/reference.py`" in readme


def test_grader_help_lists_every_lab_with_its_check_line(capsys):
    from grader.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    for name, lab in LABS.items():
        assert f"grader check {name} {lab.student_file}" in shown
