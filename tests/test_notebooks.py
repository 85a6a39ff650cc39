"""Every notebook in notebooks/ executes top to bottom (kernel python3), and is committed stripped."""
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED_TEXT = {"capacity_planning": "Cheapest:"}  # the answer each notebook must print


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"capacity_what_if.ipynb", "stop_conditions.ipynb",
                                           "latency_and_kv.ipynb", "capacity_planning.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    # The kernel runs from the repository root, so `sim` imports with or without an install.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    if "kv" in path.stem or "capacity" in path.stem:
        assert images, f"{path.name}: expected plots in the outputs"
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert EXPECTED_TEXT.get(path.stem, "") in text, f"{path.name}: missing {EXPECTED_TEXT[path.stem]!r}"
