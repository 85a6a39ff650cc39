"""`benchmarks/cost_model_accuracy.py` on a few GPUs: the leave-one-GPU-out table derives each from every
other shipped calibration, so a GPU picked alone is scored too, and a family no picked GPU measured
prints a dash, not NaN."""
from pathlib import Path

import pytest

from tests.benchmark_loader import load_benchmark

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
needs_data = pytest.mark.skipif(not PROFILES.is_dir(), reason="shared kernel profiles absent")


@needs_data
def test_one_gpu_alone_is_scored_against_every_other_calibration(capsys):
    accuracy = load_benchmark("cost_model_accuracy")
    assert accuracy.main(["--profiles", str(PROFILES), "--gpu", "rtx-4090"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("leave one GPU out"):]
    rows = [line for line in table.splitlines() if line.lstrip().startswith("rtx-4090 (ada)")]
    assert len(rows) == 2  # family and shape defaults
    assert "nan" not in table
    # all-reduce: the RTX 4090 measured none, so no cell, as in the per-GPU table
    assert rows[0].split()[6] == "-"
