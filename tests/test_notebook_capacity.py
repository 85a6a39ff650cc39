"""The capacity-planning notebook runs end to end (public API, seeded) and is committed without outputs."""
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "capacity_planning.ipynb"


def test_notebook_is_stripped():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


def test_notebook_executes_quickly():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent.parent)}}).execute()
    assert time.perf_counter() - start < 90
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "Cheapest:" in text
