"""FA2's split-KV decode path: the eager heuristic in profile rows, the split count a captured CUDA graph
froze (capture size, max_model_len) in served pure-decode steps; beside a prefill chunk, prefill units."""
import dataclasses
import math
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.prefill_waves import decode_launch_units, decode_path, decode_units, num_splits

SLOTS = 2 * 188  # RTX PRO 6000: 188 SMs, two 128-thread split-KV blocks each


def _model(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_cost_model("llama-3.1-8b", "rtx-pro-6000", **kw)


def test_heuristic_at_capture_gives_the_counts_worked_out_in_the_docs():
    # Llama-3.1-8B (8 KV heads) at max_model_len 131,072 = 1,024 blocks of 128 keys (docs/cost_model.md)
    assert [num_splits(8 * b, SLOTS, 1024) for b in (1, 2, 4, 8, 16, 32, 40)] == [40, 20, 10, 5, 5, 4, 1]
    # eagerly at 1,000 keys (8 blocks) the same batches split 8 / 8 / 8 / 4 / 8 / 4, and 1 from 38 rows
    assert [num_splits(8 * b, SLOTS, 8) for b in (1, 2, 4, 8, 16, 32, 38)] == [8, 8, 8, 4, 8, 4, 1]


@given(st.integers(1, 400), st.integers(1, 2000), st.integers(1, 128))
def test_split_count_is_within_fa2s_bounds(work, blocks, most):
    s = num_splits(work, SLOTS, blocks, most)
    assert 1 <= s <= max(1, min(most, blocks))
    if work >= 0.8 * SLOTS:
        assert s == 1


def test_pure_decode_batches_in_graphs_split_as_captured():
    cm = _model()
    heads, kv, sms, block, decided_at = cm.decode_launch(100)
    assert (heads, kv, sms, block) == (32.0, 8.0, 188, 128)
    assert decided_at == (104, 1024)  # padded to the capture size 104; max_model_len 131,072 / 128
    assert cm.decode_launch(1)[-1] == (1, 1024)
    assert cm.decode_launch(600)[-1] is None  # above the largest capture size (512): eager
    assert _model(enforce_eager=True).decode_launch(100)[-1] is None
    assert _model(max_model_len=4096).decode_launch(8)[-1] == (8, 32)


def test_captured_split_count_follows_max_model_len_not_the_contexts():
    # one decode of 300 keys: captured at 1,024 blocks it splits 40 ways (the 3 blocks walked one per
    # unit); at max_model_len 256 (2 blocks) it can split only 2 ways, so a unit walks 2 blocks
    assert decode_units(1, 3, 32.0, 8.0, 188, (1, 1024)) == (1, 1)
    assert decode_units(1, 3, 32.0, 8.0, 188, (1, 2)) == (1, 2)
    long_graph, short_graph = _model(), _model(max_model_len=256)
    batch = BatchShape([1], [299], 1)
    assert long_graph.step_time(batch) < short_graph.step_time(batch)


def test_decodes_beside_a_chunk_walk_waves_of_prefill_units():
    # beside a chunk the decodes are not swapped: 120 x 32 decode units (32 blocks = 4,096 keys each) and
    # the chunk's 8 x 32 tiles (2,560 keys per head) take 22 waves over 188 SMs, 21 at the mean unit then
    # the longest, at the *prefill* cost per key (mixed_launch.py); decode's own cost per key plays no part
    cm = _model()
    mixed = BatchShape([1] * 120 + [512], [4000] * 120 + [0], 121)

    def cost(family, k):
        return sum(dataclasses.replace(cm, **{family: dataclasses.replace(getattr(cm, family), s_per_key=k)})
                   ._terms(mixed))

    path = 21 * 32 * (2560 + 120 * 4096) / (32 * 128) + 4096
    assert cost("prefill", 2e-6) - cost("prefill", 1e-6) == pytest.approx(cm.layers * path * 1e-6, rel=1e-9)
    # (at twice its fitted value: a key cost far past it would lift the step's decode floor instead,
    # cost_model._no_cheaper_than_decodes)
    k = cm.decode.s_per_key
    assert cost("decode", 2 * k) == pytest.approx(cost("decode", k), rel=1e-12)


@given(st.integers(1, 300), st.integers(1, 40000))
def test_rows_alike_walk_whole_waves_of_units(batch, keys):
    blocks = max(math.ceil(keys / 128), 1)
    waves, per_unit = decode_units(batch, blocks, 32.0, 8.0, 188)
    assert decode_path(batch, keys, 32.0, 8.0, 188, 128) == waves * per_unit * 128
    mha = decode_units(batch, blocks, 32.0, 32.0, 188)  # no GQA: no swap, no split
    assert mha == (math.ceil(batch * 32 / 188), blocks)


@given(st.integers(2, 300), st.integers(1, 40000), st.floats(0.01, 1.0), st.sampled_from([8.0, 32.0]))
def test_shorter_rows_shorten_the_waves_before_the_last(batch, keys, ratio, kv_heads):
    full = decode_path(batch, keys, 32.0, kv_heads, 188, 128)
    mixed = decode_path(batch, keys, 32.0, kv_heads, 188, 128, None, ratio * keys)
    unit = decode_units(batch, max(math.ceil(keys / 128), 1), 32.0, kv_heads, 188)[1] * 128
    assert unit <= mixed <= full


@given(st.integers(2, 300), st.integers(1, 40000), st.integers(0, 4000), st.floats(0.01, 1.0),
       st.sampled_from([8.0, 32.0]), st.sampled_from([None, (256, 256)]))
def test_a_row_reading_more_keys_never_shortens_the_path_at_the_same_waves(batch, keys, extra, ratio, kv_heads,
                                                                             decided_at):
    """The longest row grows by `extra` keys (the mean by extra / batch): where the split count and the
    waves stay, the path never falls (the mean row's unit is its keys cut into the longest row's
    splits, rounded up to whole blocks, not the longest row's rounded unit scaled down). Fewer waves
    (splits past a row's last block hold no unit) or more splits (an eager launch's heuristic) may
    shorten it, as in the kernel."""
    def launch(k):
        blocks = max(math.ceil(k / 128), 1)
        waves, _, splits = decode_launch_units(batch, blocks, 32.0, kv_heads, 188, decided_at)
        return waves, splits
    mean = ratio * keys
    before = decode_path(batch, keys, 32.0, kv_heads, 188, 128, decided_at, mean)
    after = decode_path(batch, keys + extra, 32.0, kv_heads, 188, 128, decided_at, mean + extra / batch)
    if launch(keys + extra) == launch(keys):
        assert after >= before


def test_max_model_len_must_be_a_positive_integer():
    for bad in (0, -5, 2.5, "long"):
        with pytest.raises(ConfigError, match="max_model_len"):
            _model(max_model_len=bad)
