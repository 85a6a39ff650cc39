"""Serving prices attention at each family's own fit: a prefill-only step's attention is what the prefill
family predicts for that launch (what the held-out accuracy table scores), a decode-only step's what the
decode family predicts; and a decode row that becomes a 2-token chunk never makes a step faster."""
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.calibration import predict, shipped_calibration
from kernels_cost_model.builder import shipped_variants
from kernels_cost_model.models import get_model

CALIBRATIONS = ["a100-sxm-80gb", "b200", "b300", "gb200", "gb300", "h100-sxm", "h200", "l40s", "rtx-4090",
                "rtx-pro-6000", *shipped_variants()]
LAYOUTS = [("llama-3.1-8b", 1), ("qwen3-32b", 2), ("qwen3-30b-a3b", 2), ("llama-2-7b", 1), ("qwen2.5-0.5b", 1)]


def _model(cal: str, name: str, tp: int, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_cost_model(name, cal.split("@")[0], tp, calibration=cal if "@" in cal else "default",
                               clocks="burst", **kw)  # (the kernels' own clocks, as the families were fitted)


def _family(cal: str, family: str, name: str, tp: int, chunk: int, context: int, batch: int) -> float:
    """The family's own prediction for one launch of `batch` rows alike (calibration.predict)."""
    m = get_model(name)
    row = dict(operator=family, family=family, device=cal, chunk=chunk, context=context, batch=batch,
               num_heads=m.num_heads / tp, num_kv_heads=max(1, m.num_kv_heads // tp), head_dim=m.head_dim,
               dtype_bytes=m.dtype_bytes, measured_s=1.0)
    return float(predict([row], shipped_calibration(cal))[0])


@pytest.mark.parametrize("cal", CALIBRATIONS)
def test_prefill_only_attention_is_the_prefill_familys_prediction(cal):
    for name, tp in LAYOUTS:
        cm = _model(cal, name, tp)
        for chunk in (2, 3, 16, 128, 512, 2048):
            for context in (0, 1024, 8192):
                for batch in (1, 4):
                    served = cm.breakdown(BatchShape([chunk] * batch, [context] * batch, batch))
                    own = _family(cal, "prefill_attention", name, tp, chunk, context, batch)
                    if chunk == 2:  # no cheaper than the decodes they may have been (the step's guard)
                        own = max(own, sum(cm._attention_of([1] * batch, [context + 1] * batch, batch)) / cm.layers)
                    else:
                        assert served["decode_attention"] == 0.0
                    attention = served["prefill_attention"] + served["decode_attention"]
                    assert attention / cm.layers == pytest.approx(own, rel=1e-9)


@pytest.mark.parametrize("cal", CALIBRATIONS)
def test_decode_only_attention_is_the_decode_familys_prediction(cal):
    for name, tp in LAYOUTS:
        cm = _model(cal, name, tp, enforce_eager=True)  # eager: the split count decided at the launch itself
        for context in (128, 1024, 8192):
            for batch in (1, 8, 64, 256):
                served = cm.breakdown(BatchShape([1] * batch, [context] * batch, batch))["decode_attention"]
                own = _family(cal, "decode_attention", name, tp, 1, context, batch)
                assert served / cm.layers == pytest.approx(own, rel=1e-9)


def test_a_512_token_chunk_is_priced_at_the_prefill_fit_not_decodes_launch():
    # rtx-pro-6000@vllm-0.19, Qwen3-30B-A3B TP2: the decode fit's launch overhead (11.8 us) is more than twice
    # the prefill fit's (5.0 us); a fresh 512-token chunk pays the prefill fit's alone
    cm = _model("rtx-pro-6000@vllm-0.19", "qwen3-30b-a3b", 2)
    assert cm.decode.overhead_s > 2 * cm.prefill.overhead_s
    per_layer = cm.breakdown(BatchShape([512], [0], 1))["prefill_attention"] / cm.layers
    assert per_layer == pytest.approx(_family("rtx-pro-6000@vllm-0.19", "prefill_attention", "qwen3-30b-a3b", 2,
                                              512, 0, 1), rel=1e-9)


MONOTONE_MODELS = [(cal, name, tp) for cal in ("rtx-pro-6000@vllm-0.19", "rtx-pro-6000", "rtx-4090", "l40s",
                                               "a100-sxm-80gb", "h100-sxm", "b200")
                   for name, tp in LAYOUTS]


@given(st.sampled_from(MONOTONE_MODELS),
       st.lists(st.integers(1, 20000), min_size=1, max_size=64),
       st.one_of(st.none(), st.tuples(st.integers(3, 4096), st.integers(0, 16000))),
       st.data())
def test_a_decode_row_turned_into_a_2_token_chunk_never_shortens_the_step(which, contexts, chunk, data):
    cm = _model(*which)
    # the chunk (2, p - 1) reads the decode's (1, p) keys (a chunk over one more key is also dearer where
    # the step is monotone in context, which the mixed launch is only to within ~1e-5 today)
    i = data.draw(st.integers(0, len(contexts) - 1))
    new, ctx = [1] * len(contexts), list(contexts)
    if chunk is not None:  # beside a bigger chunk (not itself a 2-token one)
        new, ctx = new + [chunk[0]], ctx + [chunk[1]]
    before = cm.step_time(BatchShape(new, ctx, len(contexts)))
    new[i], ctx[i] = 2, ctx[i] - 1
    assert cm.step_time(BatchShape(new, ctx, len(contexts))) >= before * (1 - 1e-12)
