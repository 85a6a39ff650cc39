"""KV block copies between GPU and host: the measured curve, its reader and the unmeasured links."""
from __future__ import annotations

import csv

import pytest
from hypothesis import given, strategies as st

import kernels_cost_model.host_copies as hc
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.gpu_calibration import MEASURED_DIR
from kernels_cost_model.host_copies import host_copies
from kernels_cost_model.links import get_link


def _rows(method="per_block"):
    with (MEASURED_DIR / "h200-host-copies.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["method"] == method]


@pytest.mark.parametrize("release, method", [("0.19", "per_block"), ("0.33", "batch")])
def test_the_curve_reproduces_every_measured_size(release, method):
    copies = host_copies("pcie5", release)
    rows = _rows(method)
    assert len(rows) >= 20
    for r in rows:
        per_copy = float(r["seconds"]) / int(r["copies"])
        assert copies.seconds(3, int(r["copy_bytes"]), r["direction"]) == pytest.approx(3 * per_copy, rel=1e-12)
    assert "h200-host-copies.csv" in copies.source and method in copies.source
    with pytest.raises(ConfigError, match="release"):
        host_copies("pcie5", "0.7")


@given(st.sampled_from(["0.19", "0.33"]), st.sampled_from(["h2d", "d2h"]), st.floats(1, 2**26), st.floats(1, 2**26))
def test_a_bigger_copy_never_costs_less(release, direction, a, b):
    copies = host_copies("pcie5", release)
    small, big = sorted((a, b))
    assert 0 < copies.seconds(1, small, direction) <= copies.seconds(1, big, direction)


def test_small_copies_are_bound_by_their_count_not_their_bytes():
    """The measurement's point: 2,048 copies of 8 KiB take ~15x the time their bytes take at full speed."""
    copies = host_copies("pcie5")
    full_speed = 2048 * 8192 / 55e9
    assert copies.seconds(2048, 8192, "h2d") > 10 * full_speed
    assert copies.seconds(1, 2**24, "h2d") == pytest.approx(2**24 / 55e9, rel=0.05)   # big ones: the link's rate


def test_a_link_without_a_measurement_prices_each_copy_by_its_figures():
    link = get_link("pcie4")
    one = link.latency_s + 2**20 / link.bytes_per_s
    assert host_copies("pcie4").seconds(5, 2**20, "d2h") == pytest.approx(5 * one)
    assert host_copies("pcie5").seconds(0, 2**20, "h2d") == 0.0
    with pytest.raises(ConfigError, match="direction"):
        host_copies("pcie5").seconds(1, 2**20, "sideways")


@pytest.mark.parametrize("row, match", [
    ("per_block,h2d,lots,8,0.001,0,1", "needs integer copy_bytes"),
    ("per_block,h2d,8192,8,-1,0,1", "seconds in"),
    ("per_block,up,8192,8,0.001,0,1", "direction"),
])
def test_malformed_measurements_are_named_errors(tmp_path, monkeypatch, row, match):
    good = "\n".join(f"per_block,{d},{s},8,{s / 5e10 * 8 + 1e-5},0,1" for d in ("h2d", "d2h") for s in (8192, 65536))
    header = "method,direction,copy_bytes,copies,seconds,issue_s,bytes_per_s"
    (tmp_path / "bad.csv").write_text(f"{header}\n{good}\n{row}\n")
    monkeypatch.setattr(hc, "MEASURED_DIR", tmp_path)
    hc._measured.cache_clear()
    try:
        with pytest.raises(ConfigError, match=match):
            hc._measured("bad.csv")
    finally:
        hc._measured.cache_clear()


def test_a_second_host_measured_apart_agrees_with_the_curve():
    """The H100 host (PCIe Gen5 x16, measured the same day, not used by the curve): within 6 % per size,
    2 % at the median."""
    copies = host_copies("pcie5")
    with (MEASURED_DIR / "h100-sxm-host-copies.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "per_block"]
    errors = sorted(abs(copies.seconds(1, int(r["copy_bytes"]), r["direction"]) * int(r["copies"])
                        / float(r["seconds"]) - 1) for r in rows)
    assert len(errors) == 24 and errors[-1] < 0.06 and errors[len(errors) // 2] < 0.025
