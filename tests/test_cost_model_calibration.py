"""Calibration: recovers known coefficients, reads/validates profiles, ships fitted files, factory defaults."""
import csv
import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest

from kernels_cost_model import (Calibration, Coeffs, fit_profile, load_calibration, make_cost_model, read_profile,
                                save_calibration, write_profile)
from kernels_cost_model.calibration import (fit_family, holdout_split, predict,
                                            shipped_calibration, uncalibrated)
from kernels_cost_model.hardware import get_gpu
from kernels_cost_model.profile_schema import COLUMNS, validate_row
from kernels_cost_model.roofline import FAMILIES
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kernel_profiles"
#: Known coefficients (the prefill byte rate no faster than decode's: a cached context is read at least at
#: the decode rate, calibration.context_floor, which a fit recovering them must not meet binding).
TRUE = {"matmul": Coeffs(1.3e-15, 3.1e-13, 7e-6, 120.0), "elementwise": Coeffs(0.0, 4e-13, 2e-6),
        "prefill_attention": Coeffs(2e-15, 5e-13, 9e-6, 40.0), "decode_attention": Coeffs(1e-14, 4.5e-13, 8e-6),
        "all_reduce": Coeffs(0.0, 3e-12, 2e-5)}


def synthetic_rows() -> list[dict]:
    raw = []
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
            raw.append(dict(operator="matmul", m=m, n=n, k=k))
        raw.append(dict(operator="add", m=m, n=4096))
        raw.append(dict(operator="add", m=m, n=14336))  # two widths: bytes and token rows not collinear
    for chunk in (16, 64, 256, 1024, 4096):
        for ctx in (0, 512, 4096, 16384):
            raw.append(dict(operator="prefill_attention", batch=1, chunk=chunk, context=ctx, num_heads=32,
                            num_kv_heads=8, head_dim=128))
    for b in (1, 8, 64, 256):
        for ctx in (128, 1024, 8192, 32768):
            for heads, kv_heads in ((32, 8), (64, 1)):  # GQA rows are memory-bound, MQA rows compute-bound
                raw.append(dict(operator="decode_attention", batch=b, context=ctx, num_heads=heads,
                                num_kv_heads=kv_heads, head_dim=128))
    for size in (2**12, 2**16, 2**20, 2**24, 2**27):
        raw.append(dict(operator="all_reduce", size_bytes=size, tp=4))
    rows = [validate_row({**r, "dtype": "bfloat16", "measured_s": 1.0, "device": "h100-sxm", "source": "synthetic"})
            for r in raw]
    truth = Calibration("truth", dict(TRUE))
    for r, t in zip(rows, predict(rows, truth)):
        r["measured_s"] = float(t)
    return rows


def test_calibration_recovers_known_coefficients():
    cal = fit_profile(synthetic_rows(), "h100-sxm")
    for fam, true in TRUE.items():
        got = cal.coeffs[fam]
        for attr in ("s_per_flop", "s_per_byte", "overhead_s", "tile_rows"):
            assert getattr(got, attr) == pytest.approx(getattr(true, attr), rel=1e-4, abs=1e-25), (fam, attr)
    assert all(e["max_rel_err"] < 1e-6 for e in cal.provenance["fit_error"].values())


def test_fit_family_is_robust_to_noise():
    rows = [r for r in synthetic_rows() if r["family"] == "matmul"]
    gen = np.random.default_rng(7)
    from kernels_cost_model.calibration import costs
    flops, nbytes, t, m, _seqs, _keys = costs(rows)
    fitted = fit_family(flops, nbytes, t * gen.lognormal(0, 0.03, len(t)), m)
    assert fitted.s_per_flop == pytest.approx(TRUE["matmul"].s_per_flop, rel=0.05)
    assert fitted.s_per_byte == pytest.approx(TRUE["matmul"].s_per_byte, rel=0.05)


def _gemm_grid(tile_rows: float, noise_seed: int | None = None):
    m = np.array([1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192.0])
    flops, nbytes = 2 * m * 4096 * 4096, 2 * (2 * m * 4096 + 4096 * 4096)
    t = np.maximum(flops / 250e12 * (1 + tile_rows / m), nbytes / 1.8e12) + 5e-6
    if noise_seed is not None:
        t = t * (1 + 0.08 * np.random.default_rng(noise_seed).standard_normal(len(m)))
    return flops, nbytes, t, m


def test_gemm_shape_keeps_its_tile_term_only_where_cross_validation_supports_it():
    from kernels_cost_model.roofline_fit import fit_tiled_or_not
    tiled = fit_tiled_or_not(*_gemm_grid(64.0))
    assert tiled.tile_rows == pytest.approx(64.0, rel=1e-6)   # a real tile effect is kept exactly
    flops, nbytes, t, m = _gemm_grid(0.0, noise_seed=11)      # none, and 8 % scatter over 19 token counts
    assert fit_family(flops, nbytes, t, m).tile_rows > 50     # the plain fit bends the term to the scatter
    assert fit_tiled_or_not(flops, nbytes, t, m).tile_rows == 0.0
    few = _gemm_grid(64.0)
    assert fit_tiled_or_not(*(x[:8] for x in few)) == fit_family(*(x[:8] for x in few))  # too few to fold


def test_profile_round_trip_and_calibration_file(tmp_path):
    rows = synthetic_rows()
    path = write_profile(rows, tmp_path / "p.csv")
    back = read_profile(path)
    assert len(back) == len(rows) and back[0]["m"] == rows[0]["m"]
    cal = fit_profile(back, "h100-sxm")
    loaded = load_calibration(save_calibration(cal, tmp_path / "cal.json"))
    assert loaded.coeffs == cal.coeffs and loaded.provenance["samples"]["matmul"] == 56
    cm = make_cost_model("llama-3.1-8b", "h100", calibration=tmp_path / "cal.json", clocks="burst")
    assert cm.calibration.coeffs["matmul"] == cal.coeffs["matmul"]


def test_a_calibration_file_of_another_gpu_warns_naming_both(tmp_path):
    path = save_calibration(fit_profile(synthetic_rows(), "h100-sxm"), tmp_path / "cal.json")
    with pytest.warns(UserWarning, match=r"calibration='.*cal.json' was fitted on h100-sxm, not a100-sxm-80gb"):
        make_cost_model("llama-3.1-8b", "a100", calibration=path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_cost_model("llama-3.1-8b", "h100", calibration=path)


def write_csv(path, rows, header=COLUMNS):
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


GOOD = dict(operator="matmul", m=8, n=16, k=32, dtype="bfloat16", measured_s=1e-5, device="h100-sxm", source="x")


@pytest.mark.parametrize("bad,column", [
    (dict(operator="conv2d"), "operator"), (dict(m=""), "m"), (dict(n="wide"), "n"), (dict(k=-3), "k"),
    (dict(measured_s="0"), "measured_s"), (dict(measured_s="abc"), "measured_s"), (dict(dtype="int4"), "dtype"),
    (dict(device=""), "device")])
def test_malformed_profile_names_file_line_and_column(tmp_path, bad, column):
    path = write_csv(tmp_path / "bad.csv", [GOOD, {**GOOD, **bad}])
    with pytest.raises(ConfigError) as err:
        read_profile(path)
    assert err.value.field == f"{path}:3:{column}"


def test_moe_rows_are_costed_with_the_experts_their_routing_touched(tmp_path):
    from kernels_cost_model.roofline import operator_cost, operator_rows
    moe = dict(GOOD, operator="moe", m=16, n=2048, k=768, num_experts=128, top_k=8)
    uniform, balanced = (validate_row(dict(moe, routing=r)) for r in ("", "balanced"))
    weights = 3 * 2048 * 768 * 2  # gate/up and down of one expert, bf16
    extra = operator_cost(balanced)[1] - operator_cost(uniform)[1]
    assert extra == pytest.approx(weights * (128 - 128 * (1 - (1 - 8 / 128) ** 16)))  # 128 vs ~81 experts
    assert operator_rows(balanced) == 1.0 < operator_rows(uniform)
    with pytest.raises(ConfigError) as err:
        read_profile(write_csv(tmp_path / "r.csv", [GOOD, dict(moe, routing="skewed")]))
    assert err.value.field.endswith(":3:routing") and err.value.value == "skewed"


def test_moe_pays_its_per_routed_row_kernels_when_fitted_and_when_serving():
    from kernels_cost_model.calibration import predict, shipped_calibration
    from kernels_cost_model.operators import moe_operator
    from kernels_cost_model.roofline import operator_seqs
    cal = shipped_calibration("rtx-pro-6000")
    fused = moe_operator(cal, 2048, 768, 128, 8)
    assert fused.coeffs.s_per_seq > 0                      # fitted: alignment, activation, weighted sum
    row = validate_row(dict(GOOD, operator="moe", m=4096, n=2048, k=768, num_experts=128, top_k=8, routing="balanced",
                            device="rtx-pro-6000"))
    assert operator_seqs(row) == 4096 * 8
    # a batch that touches every expert: the fit's price of the row is what serving pays for it
    assert predict([row], cal)[0] == pytest.approx(fused.time(4096, 128, 8, 2), rel=1e-9)
    without = dataclasses.replace(fused, coeffs=dataclasses.replace(fused.coeffs, s_per_seq=0.0))
    assert fused.time(4096, 128, 8, 2) - without.time(4096, 128, 8, 2) == pytest.approx(
        4096 * 8 * fused.coeffs.s_per_seq)


def test_profile_missing_columns_or_rows(tmp_path):
    with pytest.raises(ConfigError, match="header lacks"):
        read_profile(write_csv(tmp_path / "h.csv", [GOOD], header=["operator", "m"]))
    with pytest.raises(ConfigError, match="no measurement rows"):
        read_profile(write_csv(tmp_path / "e.csv", []))
    with pytest.raises(ConfigError, match="no such file"):
        read_profile(tmp_path / "absent.csv")
    with pytest.raises(ConfigError, match="is a folder, not a profile CSV file"):
        read_profile(tmp_path)
    (tmp_path / "binary.csv").write_bytes(b"\x00\xff\xfe")   # (a UnicodeDecodeError once)
    with pytest.raises(ConfigError, match="not a text file"):
        read_profile(tmp_path / "binary.csv")


def test_fit_without_fallback_needs_every_family():
    rows = [r for r in synthetic_rows() if r["family"] == "matmul"]
    with pytest.raises(ConfigError, match="no measurements for families"):
        fit_profile(rows, "h100-sxm")
    cal = fit_profile(rows, "h100-sxm", fallback=uncalibrated(get_gpu("h100")))
    assert cal.provenance["fitted_families"] == ["matmul"]


def test_holdout_split_is_deterministic_and_disjoint():
    rows = synthetic_rows()
    fit, held = holdout_split(rows)
    assert len(fit) + len(held) == len(rows) and held and fit
    assert holdout_split(rows) == (fit, held)
    assert not {id(r) for r in fit} & {id(r) for r in held}


def test_shipped_calibrations_cover_a100_h100_with_provenance():
    for gpu in ("a100-sxm-80gb", "h100-sxm"):
        cal = shipped_calibration(gpu)
        assert cal is not None and set(FAMILIES) <= set(cal.coeffs)
        prov = cal.provenance
        assert "vidur" not in " ".join(prov["sources"]) and prov["holdout_error"]["matmul"]["median_rel_err"] < 0.1
    # not Vidur's eager rows (see gpu_calibration.SOURCES): the A100 derives its norms, the H100 measured them
    assert shipped_calibration("a100-sxm-80gb").provenance["unfitted_families"]["elementwise"].startswith(
        "derived default")
    assert "elementwise" in shipped_calibration("h100-sxm").provenance["fitted_families"]


def test_known_gpu_is_calibrated_unknown_falls_back_with_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cm = make_cost_model("llama-3.1-8b", "h100")
    assert cm.calibration.provenance["kind"] == "fitted" and cm.gpu.name == "h100-sxm"
    with pytest.warns(UserWarning, match="no calibration shipped for GPU .l4.: .*derived from calibrated GPUs"):
        cm = make_cost_model("llama-3.1-8b", "l4")
    assert cm.calibration.provenance["kind"] == "uncalibrated roofline"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_cost_model("llama-3.1-8b", "l4", calibration=None)


def test_factory_rejects_bad_tensor_parallel_and_names():
    with pytest.raises(ConfigError) as err:
        make_cost_model("llama-3.1-8b", "h100", 3)
    assert err.value.field == "tensor_parallel_size" and err.value.value == 3
    with pytest.raises(ConfigError):
        make_cost_model("llama-3.1-8b", "h100", 0)
    with pytest.raises(ConfigError, match="unknown GPU"):
        make_cost_model("llama-3.1-8b", "h1000")
    for name in ("/nonexistent/cal.json", "nosuch"):  # a typo of a name reads no file: say what is accepted
        with pytest.raises(ConfigError, match="neither a shipped calibration nor a calibration JSON file.*"
                                              "rtx-pro-6000@vllm-0.19"):
            make_cost_model("llama-3.1-8b", "h100", calibration=name)


def test_calibrated_step_times_are_plausible():
    cm = make_cost_model("llama-3.1-8b", "h100", cpu_overhead=False)
    one = cm.step_time(BatchShape([1], [1000], 1))
    weights_s = 16.06e9 / 3.35e12   # reading 8B bf16 weights at peak bandwidth
    assert weights_s < one < 2.5 * weights_s
    prefill = cm.step_time(BatchShape([4096], [0], 1))
    assert 0.5 * 2 * 8.03e9 * 4096 / 989.4e12 < prefill < 3 * 2 * 8.03e9 * 4096 / 989.4e12


def test_calibrate_out_whose_folder_cannot_be_made_fails_before_measuring(tmp_path, capsys):
    """`--out /proc/x/cpu.json` measured every kernel first, then said '/proc/x: file not found'."""
    from sim.cli import main
    blocker = tmp_path / "afile"
    blocker.write_text("x")   # a file where the folder would be
    out = blocker / "cpu.json"
    assert main(["calibrate", "--backend", "torch", "--device", "cpu", "--quick", "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.err.startswith(f"servesim: error: --out='{out}': cannot create its folder {blocker}:")
    assert "measured" not in printed.out   # (nothing was measured)
