"""Decode imbalance: decodes of different contexts in one launch, priced from measured skew shots."""
import csv
import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.aiconfigurator_tables import MalformedTableError
from kernels_cost_model.attention_backend import decode_imbalance, imbalance_alpha, read_skew_rows
from kernels_cost_model.batch import BatchShape

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT.parent / "shared" / "data" / "kernel_profiles"


def test_measured_gpus_have_both_regimes_and_others_none():
    for gpu in ("rtx-pro-6000", "rtx-4090", "h100-sxm", "h200"):
        pure, mixed = decode_imbalance(gpu)
        assert pure and mixed and all(0.0 <= a <= 1.0 for _, a in pure + mixed)
    assert decode_imbalance("b200") is None and decode_imbalance("h100-pcie") is None


def test_alpha_interpolates_in_log_decodes_and_holds_its_ends():
    points = ((2, 0.8), (8, 0.2))
    assert imbalance_alpha(points, 4) == pytest.approx(0.5)
    assert imbalance_alpha(points, 1) == 0.8 and imbalance_alpha(points, 64) == 0.2
    assert imbalance_alpha((), 4) == 0.0


def _attn(model, batch):
    b = model.breakdown(batch)
    return b["decode_attention"] + b["prefill_attention"]


@pytest.mark.parametrize("chunk", [0, 512])
def test_skewed_decodes_cost_between_the_mean_and_the_longest_context(chunk):
    m = make_cost_model("llama-3.1-8b", "rtx-pro-6000")
    pf_new, pf_ctx = ([chunk], [0]) if chunk else ([], [])

    def batch(ctxs):
        return BatchShape(pf_new + [1] * len(ctxs), pf_ctx + ctxs, len(ctxs) + bool(chunk))
    skewed, mean, longest = batch([500, 500, 500, 6500]), batch([2000] * 4), batch([6500] * 4)
    assert _attn(m, mean) < _attn(m, skewed) < _attn(m, longest)


def test_uniform_decodes_are_priced_as_before():
    m = make_cost_model("llama-3.1-8b", "rtx-pro-6000")
    import dataclasses
    plain = dataclasses.replace(m, decode_imbalance=None)
    b = BatchShape([1] * 16, [3000] * 16, 16)
    assert m.step_time(b) == pytest.approx(plain.step_time(b))


@given(st.lists(st.integers(0, 8000), min_size=1, max_size=40), st.integers(0, 8000))
def test_a_longer_decode_context_never_shortens_the_step(ctxs, extra):
    """The imbalance term never makes a longer row cheaper. (FA2's split-KV units are left out here: a
    longer row can take fewer units, fewer waves and a shorter step, as the kernel does; at the same
    waves its path never shortens either, tests/test_decode_splits.py.)"""
    import dataclasses
    m = dataclasses.replace(make_cost_model("llama-3.1-8b", "rtx-pro-6000"), decode_waves=(0, 0.0, 0.0, 0, 0))
    assert m.decode_imbalance is not None
    longer = [ctxs[0] + extra] + ctxs[1:]
    assert (m.step_time(BatchShape([1] * len(ctxs), longer, len(ctxs)))
            >= m.step_time(BatchShape([1] * len(ctxs), ctxs, len(ctxs))) - 1e-12)


def test_reader_rejects_malformed_tables_by_file_and_column(tmp_path):
    bad = tmp_path / "skew.csv"
    bad.write_text("regime,n\npure,4\n")
    with pytest.raises(MalformedTableError, match="columns"):
        list(read_skew_rows(bad))
    bad.write_text("regime,n,alpha\nsideways,4,0.1\n")
    with pytest.raises(MalformedTableError, match="regime"):
        list(read_skew_rows(bad))
    bad.write_text("regime,n,alpha\npure,four,0.1\n")
    with pytest.raises(MalformedTableError, match="skew.csv:2"):
        list(read_skew_rows(bad))
    bad.write_text("regime,n,alpha\npure,4,\nmixed,2,0.5\n")
    assert list(read_skew_rows(bad)) == [("mixed", 2, 0.5)]


@pytest.mark.skipif(not (PROFILES / "llmservingsim").is_dir(), reason="shared kernel profiles absent")
def test_shipped_table_is_what_the_fit_script_derives_from_the_measurements():
    spec = importlib.util.spec_from_file_location("fdi", ROOT / "benchmarks" / "fit_decode_imbalance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fitted = [{k: str(v) for k, v in r.items()} for r in mod.fit(PROFILES)]
    shipped = list(csv.DictReader((ROOT / "kernels_cost_model" / "data" / "decode_imbalance.csv").open()))
    assert fitted == shipped
