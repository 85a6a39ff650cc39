"""Mixed-batch decode rates and decode-imbalance alphas for a GPU without its own rows, derived from the
GPUs with rows (derived_mechanisms.py)."""
import dataclasses
from statistics import median

import pytest

from kernels_cost_model import make_cost_model
from kernels_cost_model.attention_backend import REGIMES, decode_imbalance, mixed_decode_s_per_byte
from kernels_cost_model.derived_mechanisms import decode_imbalance_for, mixed_decode_for
from kernels_cost_model.hardware import get_gpu


def _renamed(name: str, **kw):
    gpu = get_gpu(name)
    return dataclasses.replace(gpu, name=f"{gpu.name}@uncalibrated", **kw)


def test_a_gpu_with_its_own_rows_keeps_them():
    assert mixed_decode_for(get_gpu("rtx-pro-6000")) == (mixed_decode_s_per_byte("rtx-pro-6000"), ("rtx-pro-6000",))
    for name in ("rtx-pro-6000", "rtx-4090"):
        assert decode_imbalance_for(get_gpu(name)) == (decode_imbalance(name), (name,))
    cm = make_cost_model("llama-3.1-8b", "rtx-pro-6000", 1)
    assert cm.mixed_decode == mixed_decode_s_per_byte("rtx-pro-6000")
    assert cm.decode_imbalance == decode_imbalance("rtx-pro-6000")
    assert dict(cm.mechanism_sources) == {"mixed_decode": ("rtx-pro-6000",), "decode_imbalance": ("rtx-pro-6000",)}


def test_an_fa2_gpu_takes_the_donors_rates_per_byte_of_bandwidth():
    (sq, skv), donors = mixed_decode_for(get_gpu("a100-sxm-80gb"))
    assert donors == ("rtx-pro-6000",)
    own_q, own_kv = mixed_decode_s_per_byte("rtx-pro-6000")
    ratio = get_gpu("rtx-pro-6000").hbm_bytes_per_s / get_gpu("a100-sxm-80gb").hbm_bytes_per_s
    assert sq == pytest.approx(own_q * ratio) and skv == pytest.approx(own_kv * ratio)
    doubled = _renamed("rtx-4090", hbm_bytes_per_s=2 * get_gpu("rtx-4090").hbm_bytes_per_s)
    half = mixed_decode_for(_renamed("rtx-4090"))[0]
    assert mixed_decode_for(doubled)[0] == pytest.approx(tuple(v / 2 for v in half))


def test_a_left_out_gpu_never_donates_to_itself():
    (rates, donors) = mixed_decode_for(_renamed("rtx-pro-6000"))
    assert "rtx-pro-6000" not in donors
    assert rates == (0.0, 0.0) or donors                   # no other FA2 row: no penalty, no invention
    points, donors = decode_imbalance_for(_renamed("rtx-pro-6000"))
    assert donors == ("rtx-4090",) and points == decode_imbalance("rtx-4090")


def test_alphas_are_the_median_over_the_group_per_regime_and_decodes():
    points, donors = decode_imbalance_for(get_gpu("l40s"))
    assert donors == ("rtx-4090", "rtx-pro-6000")
    for i, regime in enumerate(REGIMES):
        measured = [dict(decode_imbalance(d)[i]) for d in donors]
        for n, alpha in points[i]:
            assert alpha == pytest.approx(median(m[n] for m in measured if n in m)), (regime, n)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "b200"])
def test_a_gpu_whose_kernels_are_not_fa2_gets_no_mixed_batch_penalty(gpu):
    assert mixed_decode_for(get_gpu(gpu)) == ((0.0, 0.0), ())
    cm = make_cost_model("llama-3.1-8b", gpu, 1)
    assert cm.mixed_decode == (0.0, 0.0)


def test_imbalance_comes_only_from_gpus_running_the_same_kernels():
    assert decode_imbalance_for(get_gpu("b200")) == (None, ())      # no measured GPU runs its kernels
    assert make_cost_model("llama-3.1-8b", "b200", 1).decode_imbalance is None
    for gpu in ("h100-sxm", "h200"):                                 # FlashAttention-3, measured (own rows)
        assert decode_imbalance_for(get_gpu(gpu)) == (decode_imbalance(gpu), (gpu,))
    points, donors = decode_imbalance_for(get_gpu("h100-pcie"))      # Hopper without rows: the Hopper GPUs'
    assert donors == ("h100-sxm", "h200")
    pure = dict(points[0])
    assert pure[16] == pytest.approx(median(dict(decode_imbalance(d)[0])[16] for d in donors))
    points, donors = decode_imbalance_for(_renamed("h200"))          # left out: the other Hopper GPU only
    assert donors == ("h100-sxm",) and points == decode_imbalance("h100-sxm")
