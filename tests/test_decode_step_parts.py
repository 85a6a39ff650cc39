"""benchmarks/decode_step_parts.py on the CPU with a tiny rank: every part runs, and vLLM's one-kernel
KV-cache write stores what the composed step's two copies store."""
import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rank(monkeypatch):
    parts = _load("decode_step_parts")
    composed = sys.modules["decode_step_composed"]  # (the module its `Rank` comes from)
    for module in (composed, parts):
        monkeypatch.setattr(module, "DEVICE", "cpu")
    monkeypatch.setattr(composed, "BATCHES", (1, 4))
    from kernels_cost_model.torch_backend import _elementwise_ops
    shapes = {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "inter": 96, "vocab": 100, "layers": 3}
    with torch.inference_mode():
        yield parts, parts.PartsRank(torch, None, _elementwise_ops(torch, compiled=False), shapes, 9)


def test_every_part_runs_and_the_step_without_attention_samples_one_token_a_request(rank):
    parts, r = rank
    with torch.inference_mode():
        assert r.part("no_attention", 4, 8)().shape == (4,)
        assert r.part("matmuls", 4, 8)().shape == (4, 100)
        for name in ("kv_write_two", "kv_write_one"):
            assert r.part(name, 4, 8)() is None


def test_one_copy_writes_what_two_copies_write(rank):
    parts, r = rank
    with torch.inference_mode():
        torch.manual_seed(0)
        r.part("kv_write_one", 4, 5)()
        one = [cache[:, :4, 5].clone() for cache in r.caches]
        for cache in r.caches:
            cache.zero_()
        torch.manual_seed(0)
        r.part("kv_write_two", 4, 5)()
        for cache, expected in zip(r.caches, one):
            assert torch.equal(cache[:, :4, 5], expected) and expected.abs().sum() > 0
            assert cache[:, :4, 4].abs().sum() == 0  # nothing written beside the position


def test_the_measurement_writes_a_row_per_rank_batch_context_and_part(rank, monkeypatch, tmp_path):
    """`--measure`'s loop on the CPU: the tiny rank for every model, plain calls for the CUDA-graph timer."""
    parts, r = rank
    composed = sys.modules["decode_step_composed"]
    from kernels_cost_model import torch_backend
    plain_ops = torch_backend._elementwise_ops
    monkeypatch.setattr(torch_backend, "_elementwise_ops", lambda torch, compiled: plain_ops(torch, False))
    monkeypatch.setattr(composed, "rank_shapes", lambda spec, tp: dict(r.s))
    monkeypatch.setattr(parts, "time_step", lambda torch, fn: (fn(), 1e-3, 1e-3, 1e-3)[1:])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "CPU")
    monkeypatch.setattr(parts, "BATCHES", (1, 4))
    monkeypatch.setattr(parts, "CONTEXTS", (5, 7))
    measured = parts.read(parts.measure("cpu", tmp_path, 600.0))
    assert set(measured) == {(m, tp, b, c) for m, tp in parts.RANKS for b in (1, 4) for c in (5, 7)}
    assert all(set(p) == set(parts.PARTS) for p in measured.values())
