"""Prefill over a cached context on GPUs whose prefill fits saw only empty caches (Hopper, Blackwell):
the chunk's tile term covers its own tokens, and the cached keys are read at least at the decode rate."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.calibration import predict, shipped_calibration
from kernels_cost_model.models import get_model
from kernels_cost_model.roofline import prefill_tile_rows
from kernels_cost_model.shape_keys import attention_coeffs

NON_FA2 = ("h100-sxm", "h200", "b200", "gb300")


def row(gpu: str, chunk: int, context: int, batch: int = 1, model: str = "llama-3.1-8b") -> dict:
    m = get_model(model)
    return dict(operator="prefill_attention", family="prefill_attention", device=gpu, chunk=chunk,
                context=context, batch=batch, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                head_dim=m.head_dim, dtype_bytes=m.dtype_bytes, measured_s=1.0)


def price(gpu: str, chunk: int, context: int, batch: int = 1) -> float:
    return float(predict([row(gpu, chunk, context, batch)], shipped_calibration(gpu))[0])


@given(st.integers(1, 1 << 15))
def test_over_an_empty_cache_the_tile_rows_are_the_chunk(chunk):
    assert prefill_tile_rows(chunk, 0) == chunk
    assert prefill_tile_rows(chunk, 100) > chunk


@pytest.mark.parametrize("gpu", NON_FA2)
def test_cached_context_runs_at_the_familys_flop_rate(gpu):
    """A 512-token chunk is compute-bound over any context: each cached token adds its pairs at the
    family's FLOP rate plus its key on the critical path, with no tile factor (it was 1 + T / 512)."""
    m = get_model("llama-3.1-8b")
    c = attention_coeffs(shipped_calibration(gpu).coeffs, "prefill_attention", m.num_heads, m.num_kv_heads,
                         m.head_dim)
    slope = (price(gpu, 512, 8192) - price(gpu, 512, 4096)) / 4096
    expected = 4 * m.head_dim * m.num_heads * 512 * c.s_per_flop + c.s_per_key
    assert c.tile_rows > 100 and slope == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("gpu", NON_FA2)
def test_a_short_chunk_reads_its_cache_at_least_at_the_decode_rate(gpu):
    m = get_model("llama-3.1-8b")
    cal = shipped_calibration(gpu)
    dc = attention_coeffs(cal.coeffs, "decode_attention", m.num_heads, m.num_kv_heads, m.head_dim)
    pf = attention_coeffs(cal.coeffs, "prefill_attention", m.num_heads, m.num_kv_heads, m.head_dim)
    cache = 2 * 2 * 32768 * m.num_kv_heads * m.head_dim      # K and V of 32,768 cached tokens, bf16
    assert pf.s_per_byte < dc.s_per_byte                        # the prefill fit's own rate is not binding
    assert price(gpu, 16, 32768) >= cache * dc.s_per_byte + pf.overhead_s


@given(st.sampled_from(NON_FA2), st.integers(2, 8192), st.integers(0, 65536), st.integers(1, 65536),
       st.integers(1, 8))
def test_more_cached_context_never_makes_a_prefill_cheaper(gpu, chunk, context, more, batch):
    assert price(gpu, chunk, context + more, batch) >= price(gpu, chunk, context, batch)


@pytest.mark.parametrize("gpu", ("rtx-pro-6000", "l40s", "a100-sxm-80gb"))
def test_fa2_gpus_keep_their_units_and_waves(gpu):
    """FA2 GPUs price a prefill by its units' keys (prefill_waves.py), fitted with cached contexts: the
    empty-cache rules above do not touch them."""
    from kernels_cost_model.calibration import context_floor
    assert context_floor(shipped_calibration(gpu), row(gpu, 16, 32768)) == 0.0
