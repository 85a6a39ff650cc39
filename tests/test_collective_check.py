"""The two-GPU collective cross-check: independent RTX PRO 6000 measurements against the shipped sweep."""

import pytest

from kernels_cost_model.aiconfigurator_tables import MalformedTableError, read_nccl
from sim.fidelity.collective_check import DEFAULT_PROFILES, _log_interp, compare

HAVE_TABLES = (DEFAULT_PROFILES / "aiconfigurator" / "rtx_pro_6000_server" / "comm").is_dir()
needs_tables = pytest.mark.skipif(not HAVE_TABLES, reason="../shared/data/kernel_profiles/aiconfigurator absent")


def test_log_interp_is_linear_in_log_size_and_clamped():
    points = [(1e3, 1.0), (1e5, 3.0)]
    assert _log_interp(points, 1e4) == pytest.approx(2.0)
    assert _log_interp(points, 10.0) == 1.0 and _log_interp(points, 1e9) == 3.0


def test_read_nccl_names_a_missing_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "aiconfigurator" / "x" / "comm" / "nccl" / "2.29.2"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"op_name": ["all_reduce"], "latency": [0.01]}), folder / "nccl_perf.parquet")
    with pytest.raises(MalformedTableError, match="columns"):
        list(read_nccl(tmp_path, "x"))


def test_read_nccl_of_an_absent_system_is_empty(tmp_path):
    assert list(read_nccl(tmp_path, "nowhere")) == []


@needs_tables
def test_two_hosts_nccl_agree_from_300_kb():
    """nccl-tests on AIConfigurator's host and vLLM's PyNccl on LLMServingSim's agree within 15 %
    where bandwidth dominates: the sweep is not a slow or fast outlier host."""
    rows = [p for p in compare() if p.size_bytes >= 3e5]
    assert len(rows) >= 10
    assert all(0.85 <= p.nccl_tests_s / p.sweep_s <= 1.15 for p in rows)


@needs_tables
def test_vllm_all_reduce_is_faster_than_nccl_below_its_custom_limit():
    """vLLM's own all-reduce on two of these GPUs beats NCCL below 8 MB (custom all-reduce) and equals
    it above (its NCCL fallback): with P2P working, serving collectives cannot be slower than the sweep."""
    rows = compare()
    small = [p for p in rows if p.size_bytes < 5e6]
    large = [p for p in rows if p.size_bytes >= 8 * 2**20]
    assert small and large
    assert all(p.vllm_all_reduce_s < 0.9 * p.sweep_s for p in small)
    assert all(p.vllm_all_reduce_s == pytest.approx(p.nccl_tests_s, rel=0.03) for p in large)
