"""servesim's FlashAttention-3 decode measurements on Hopper (benchmarks/fa3_paged_decode.py): provenance,
repeatability, the decode-imbalance alphas made from them, and the check they give of the shipped
calibrations (fitted to vLLM's own layer times, which these bare kernels never fed)."""
import csv
import importlib.util
import json
from pathlib import Path

import pytest

from kernels_cost_model.attention_backend import decode_imbalance
from kernels_cost_model.gpu_calibration import MEASURED_DIR
from kernels_cost_model.profile_schema import read_profile

ROOT = Path(__file__).resolve().parents[1]
GPUS = ("h100-sxm", "h200")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _script("fa3_paged_decode")


@pytest.mark.parametrize("gpu", GPUS)
def test_files_record_device_date_software_and_kv_form(gpu):
    env = json.loads((MEASURED_DIR / f"{gpu}-fa3-decode.env.json").read_text())
    assert env["capability"] == "9.0" and "fa3_fwd" in env["software"] and env["reference_check_max_abs_diff"] < 0.05
    source = f"servesim {env['date']} ({env['software']}, {env['device']}; {env['kv_form']})"
    for name, count in (("decode", 191), ("decode-eager", 191), ("decode.repeat", 48)):
        rows = read_profile(BENCH.profile_path(gpu, name))
        assert len(rows) == count and {r["operator"] for r in rows} == {"decode_attention"}
        assert {r["device"] for r in rows} == {gpu} and all(r["source"].startswith(source) for r in rows)
    with (MEASURED_DIR / f"{gpu}-fa3-skew.csv").open() as f:
        shots = list(csv.DictReader(f))
    assert len(shots) == len(BENCH.skew_shots()) and all(s["source"] == source for s in shots)


@pytest.mark.parametrize("gpu", GPUS)
def test_a_repeat_times_the_same_kernels(gpu):
    assert BENCH.repeat_difference(gpu) < 0.02


@pytest.mark.parametrize("gpu", GPUS)
def test_shipped_hopper_alphas_are_the_median_of_the_own_shots(gpu):
    fit = _script("fit_decode_imbalance")
    derived = fit.median_rows(gpu, [MEASURED_DIR / f"{gpu}-fa3-skew.csv"], fit.OWN_SOURCE.format(gpu=gpu))
    with (ROOT / "kernels_cost_model" / "data" / "decode_imbalance.csv").open() as f:
        shipped = [r for r in csv.DictReader(f) if r["gpu"] == gpu]
    assert [{k: str(v) for k, v in r.items()} for r in derived] == shipped
    pure = dict(decode_imbalance(gpu)[0])
    assert max(pure[n] for n in (4, 8, 16)) > 0.1 and max(pure[n] for n in (64, 128, 256)) < 0.01


@pytest.mark.parametrize("gpu", GPUS)
def test_the_other_hopper_gpus_alphas_price_small_skewed_batches_better_than_none(gpu):
    other = next(g for g in GPUS if g != gpu)
    none, held, fa2 = (BENCH.skew_errors(gpu, d) for d in (None, other, "rtx-pro-6000"))
    for regime in ("pure", "mixed"):
        assert held[(regime, (2, 16))][1] < none[(regime, (2, 16))][1]
    for band in ((2, 16), (32, 256)):          # FA2's alphas beside a chunk: worse than none on FA3
        assert fa2[("mixed", band)][1] > none[("mixed", band)][1]


@pytest.mark.parametrize("gpu", GPUS)
def test_the_shipped_calibration_against_the_bare_fa3_decodes(gpu):
    """In L2 the calibration prices a few us per launch above the bare kernel (vLLM's attention layer
    around it, which the fitted tables timed); from 1 GB of KV it is within 12 %, faster."""
    bands = {band: rest for band, *rest in BENCH.decode_errors(gpu, "decode")}
    n, _abs_err, _signed, diff_us = bands["in L2 (< 64 MB)"]
    assert n == 64 and 2.0 < diff_us < 10.0
    n, abs_err, signed, _diff = bands[">= 1 GB"]
    assert n == 45 and abs_err < 0.12 and signed < 0
