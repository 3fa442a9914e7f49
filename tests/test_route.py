"""course.route: every notebook is on the map, the map's needs point backwards, and the README agrees."""

from pathlib import Path

import pytest

from course import route

pytestmark = pytest.mark.unit0

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_every_notebook_is_on_the_map_once():
    numbers = [unit.number for unit in route.UNITS]
    assert len(numbers) == len(set(numbers))
    missing = {path.name.split("_")[0] for path in NOTEBOOKS} - set(numbers)
    assert not missing, f"notebooks not on the course map: {sorted(missing)}; add them to course.route.UNITS"


def test_the_core_path_ends_in_its_capstone_and_needs_point_backwards():
    order = [unit.number for unit in route.UNITS]
    assert [u.part for u in route.UNITS if u.part in ("core", "capstone")][-1] == "capstone"
    assert next(u for u in route.UNITS if u.part == "capstone").number == "06"
    for unit in route.UNITS:
        assert unit.part in route.PARTS
        assert all(order.index(need) < order.index(unit.number) for need in unit.needs), unit


def test_the_readme_marks_each_notebook_as_the_map_does():
    readme = (ROOT / "README.md").read_text()
    for unit in route.UNITS:
        rows = [line for line in readme.splitlines() if line.startswith((f"| `{unit.number}_", f"| `{unit.number}` "))]
        assert len(rows) == 1, f"README: expected one syllabus row for {unit.number}"
        part = rows[0].split("|")[2].strip().strip("*").lower()
        assert part.startswith(unit.part if unit.part != "beyond" else "optional"), (unit, rows[0])


def test_the_printed_map_names_every_part_and_says_what_is_coming():
    text = "\n".join(route.lines())
    assert all(meaning in text for meaning in route.PARTS.values())
    assert "capstone" in text and "06  the assignment" in text
    for unit in route.UNITS:
        assert (f"{unit.number}  {unit.topic}" in text) and (("[coming soon]" in text) or unit.present())
