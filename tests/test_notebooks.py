"""The notebooks are stored clean (CI runs them with ``pytest --nbmake notebooks/``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_gallery_is_there():
    names = {p.name for p in NOTEBOOKS}
    for name in ("01_quickstart.ipynb", "02_schedule_gallery.ipynb", "03_manual_vs_auto.ipynb", "04_explorer.ipynb",
                 "07_other_frameworks.ipynb"):
        assert name in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    book = json.loads(path.read_text(encoding="utf-8"))
    assert book["metadata"]["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(book["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs: clear them before committing"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
