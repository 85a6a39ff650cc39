"""Clocks under the power cap (kernels_cost_model/power_cap.py): the measurements it rests on, the
factor it takes from them, and what `clocks="sustained"` changes in a step's price."""
import csv
import importlib.util
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model import make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError
from kernels_cost_model.gpu_calibration import MEASURED_DIR
from kernels_cost_model.power_cap import COMPUTE_BOUND_ROWS, sustained_compute_factor
from kernels_cost_model.roofline import COEFF_FIELDS, PREFILL_FAMILIES
from sim.api.sections import DeploymentConfig
from sim.api.cost_setup import build_cost_model, describe_cost_model
from sim.cli.main import build_parser
from sim.cli.run import config_from_args

GPUS = ("h100-sxm", "h200")
ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("matmul_sustained", ROOT / "benchmarks" / "matmul_sustained.py")
BENCH = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(BENCH)


def files(gpu: str) -> list[Path]:
    return sorted(MEASURED_DIR.glob(f"{gpu}-matmul-sustained*.csv"))


def gemms(path: Path) -> dict:
    """{rows: (after-idle pair row, sustained pair row)} of the gate-up GEMM."""
    return {rows: (pair["after_idle"], pair["sustained"]) for (kind, rows), pair in BENCH.read(path).items()
            if kind == "gate_up"}


def seconds(row: dict) -> float:
    return float(row["per_call_s"])


@pytest.mark.parametrize("gpu", GPUS)
def test_the_runs_show_compute_bound_gemms_held_at_the_power_cap_and_weight_bound_ones_not(gpu):
    assert files(gpu)
    for path in files(gpu):
        with path.open() as f:
            assert all(r["device"] == gpu and "NVML" in r["source"] for r in csv.DictReader(f))
        for rows, (idle, busy) in gemms(path).items():
            if rows >= COMPUTE_BOUND_ROWS:
                assert float(busy["power_capped_s"]) > 1.5 and float(busy["sm_clock_mhz"]) < 1600
                assert float(busy["power_w"]) > 680 and 1.05 < seconds(busy) / seconds(idle) < 1.25
            if rows == 16:  # bound by reading 235 MB of weights: no cap, no slowdown
                assert float(busy["power_capped_s"]) == 0.0 and abs(seconds(busy) / seconds(idle) - 1) < 0.05


def test_the_factor_is_the_median_slowdown_of_compute_bound_gemms_and_one_where_not_measured():
    assert 1.08 < sustained_compute_factor("h100-sxm") < 1.14
    assert 1.15 < sustained_compute_factor("h200") < 1.20
    ratios = [seconds(b) / seconds(i) for p in files("h200") for m, (i, b) in gemms(p).items()
              if m >= COMPUTE_BOUND_ROWS]
    assert sorted(ratios)[len(ratios) // 2 - 1] <= sustained_compute_factor("h200") <= sorted(ratios)[len(ratios) // 2]
    assert sustained_compute_factor("a100-sxm-80gb") == sustained_compute_factor("no-such-gpu") == 1.0


@pytest.mark.parametrize("gpu", GPUS)
def test_sustained_clocks_scale_the_compute_coefficients_only(gpu):
    burst = make_cost_model("llama-3.1-8b", gpu).calibration.coeffs
    capped = make_cost_model("llama-3.1-8b", gpu, clocks="sustained").calibration.coeffs
    factor = sustained_compute_factor(gpu)
    assert burst.keys() == capped.keys()
    for key, c in burst.items():
        scaled = {"s_per_flop", "s_per_attention_flop", "s_per_chunk_row"}
        if key.startswith(PREFILL_FAMILIES):
            scaled.add("s_per_key")
        for name in COEFF_FIELDS:
            expected = getattr(c, name) * (factor if name in scaled else 1.0)
            assert getattr(capped[key], name) == pytest.approx(expected, rel=1e-12), (key, name)


@pytest.mark.parametrize("gpu", GPUS)
def test_the_roofline_at_the_factor_gives_each_measured_gemms_slowdown(gpu):
    """The priced gate-up GEMM at sustained over burst clocks, against the measured sustained over
    after-idle time, at every row count: the roofline's max(compute x factor, memory) leaves the GEMMs
    bound by their weights alone and slows the rest by the factor (within 6 %, the knee included)."""
    burst = make_cost_model("llama-3.1-70b", gpu, 4).up
    capped = make_cost_model("llama-3.1-70b", gpu, 4, clocks="sustained").up
    for path in files(gpu):
        for rows, (idle, busy) in gemms(path).items():
            priced = capped.time(rows, 2) / burst.time(rows, 2)
            assert priced == pytest.approx(seconds(busy) / seconds(idle), rel=0.06), (path.name, rows)


def test_weight_bound_decode_steps_keep_their_price_and_a_long_prefill_slows_by_about_the_factor():
    burst = make_cost_model("llama-3.1-8b", "h100", cpu_overhead=False)
    capped = make_cost_model("llama-3.1-8b", "h100", cpu_overhead=False, clocks="sustained")
    factor = sustained_compute_factor("h100-sxm")
    decodes = BatchShape([1] * 8, [1024] * 8, 8)
    assert capped.step_time(decodes) == burst.step_time(decodes)
    prefill = BatchShape([4096], [0], 1)
    assert 1 + 0.8 * (factor - 1) < capped.step_time(prefill) / burst.step_time(prefill) <= factor
    assert capped.compute_clock_factor == factor and burst.compute_clock_factor == 1.0


def test_a_gpu_without_a_measurement_prices_the_same_at_both_clocks():
    batch = BatchShape([2048, 1, 1], [0, 500, 900], 3)
    assert (make_cost_model("llama-3.1-8b", "a100", clocks="sustained").step_time(batch)
            == make_cost_model("llama-3.1-8b", "a100").step_time(batch))


def test_clocks_outside_the_two_regimes_are_named_errors():
    with pytest.raises(ConfigError, match="clocks"):
        make_cost_model("llama-3.1-8b", "h100", clocks="turbo")
    with pytest.raises(ConfigError, match="deployment.clocks"):
        DeploymentConfig(clocks="turbo")


def test_the_deployment_and_the_command_line_choose_the_clocks():
    args = build_parser().parse_args(["run", "--gpu", "h200", "--clocks", "sustained"])
    deployment = config_from_args(args).deployment
    assert deployment.clocks == "sustained"
    cost_model = build_cost_model(deployment)
    assert cost_model.compute_clock_factor == sustained_compute_factor("h200")
    assert "power-capped clock (x1.19)" in describe_cost_model(cost_model)
    assert "power-capped" not in describe_cost_model(build_cost_model(DeploymentConfig(gpu="h200")))


def test_a_drafter_runs_at_the_deployments_clocks_too():
    from sim.api.spec_setup import proposer_cost
    from sim.core.speculative import SpeculativeConfig
    spec = SpeculativeConfig(method="draft_model", model="qwen2.5-0.5b", num_speculative_tokens=3)
    capped = proposer_cost(spec, DeploymentConfig(gpu="h200", clocks="sustained")).draft
    burst = proposer_cost(spec, DeploymentConfig(gpu="h200")).draft
    assert getattr(capped, "base", capped).compute_clock_factor == sustained_compute_factor("h200")
    assert getattr(burst, "base", burst).compute_clock_factor == 1.0


_COST_MODELS: dict = {}


def _pair(model: str, gpu: str, tp: int):
    """(burst, sustained) cost models, built once per shape."""
    key = (model, gpu, tp)
    if key not in _COST_MODELS:
        _COST_MODELS[key] = tuple(make_cost_model(model, gpu, tp, clocks=c) for c in ("burst", "sustained"))
    return _COST_MODELS[key]


@st.composite
def batches(draw):
    """A step of decodes and prefill chunks (with cached contexts), some rows sampling."""
    rows = draw(st.lists(st.tuples(st.sampled_from([1, 1, 1, 2, 17, 256, 2048]), st.integers(0, 9000)),
                         min_size=1, max_size=40))
    new, context = [n for n, _ in rows], [c for _, c in rows]
    return BatchShape(new, context, draw(st.integers(1, len(rows))))


@given(batches(), st.sampled_from([("llama-3.1-8b", "h100", 1), ("llama-3.1-70b", "h200", 4),
                                   ("qwen3-30b-a3b", "h100", 2)]))
def test_a_step_at_sustained_clocks_is_never_faster_nor_slower_than_the_factor_allows(batch, shape):
    """Only compute slows, by the GPU's factor: a step costs at least its burst price and at most the
    factor times it (CPU time, memory and launch overheads unchanged)."""
    burst, capped = _pair(*shape)
    low, high = burst.step_time(batch), capped.step_time(batch)
    assert low <= high <= capped.compute_clock_factor * low * (1 + 1e-12)
