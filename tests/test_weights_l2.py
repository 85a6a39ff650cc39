"""GEMM weights timed in L2 (a benchmark state: the collector cycles 6 copies) are read from DRAM in serving."""
import dataclasses

import pytest

from kernels_cost_model import make_cost_model, weights_l2
from kernels_cost_model.calibration import predict, shipped_calibration
from kernels_cost_model.operators import matmul_operator
from kernels_cost_model.profile_schema import validate_row
from kernels_cost_model.shape_keys import matmul_key
from kernels_cost_model.weights_l2 import dram_line, grid_shapes, one_row_bytes, weight_floor, weights_in_l2
from tests.benchmark_loader import load_benchmark

MIB = 2**20


def _row(device: str, m: float, n: float, k: float) -> dict:
    return validate_row({"operator": "matmul", "m": m, "n": n, "k": k, "dtype": "bfloat16", "measured_s": 1e-5,
                         "device": device, "source": "test"}, "test")


def test_residency_is_six_copies_of_the_weight_against_the_l2(monkeypatch):
    # l40s, 96 MiB of L2: 4096 x 2048 bf16 is 16 MiB, six copies 96 MiB (fit); 4096 x 2560 is 20 MiB (no)
    assert weights_in_l2("l40s", 4096, 2048)
    assert not weights_in_l2("l40s", 4096, 2560)
    # h100, 50 MiB: six copies of 8 MiB fit, of 9 MiB not
    assert weights_in_l2("h100-sxm", 4096, 1024) and not weights_in_l2("h100-sxm", 4608, 1024)
    assert not weights_in_l2("no-such-gpu", 512, 512)           # no L2 size: never resident
    monkeypatch.setattr(weights_l2, "GEMM_WEIGHT_COPIES", 1)    # one copy: 20 MiB fits in 96 MiB
    assert weights_in_l2("l40s", 4096, 2560)


def test_dram_line_is_fitted_on_the_shapes_that_were_not_l2_resident():
    cal = shipped_calibration("l40s")
    line = dram_line(cal.coeffs, "l40s")
    # the L40S's weights past 16 MiB stream at 660-720 GB/s, under its 864 GB/s of DRAM
    assert 600e9 < 1.0 / line.s_per_byte < 864e9
    shapes = [s for s in grid_shapes(cal.coeffs) if not weights_in_l2("l40s", *s)]
    assert len(shapes) > 100
    assert dram_line({}, "l40s") is None and dram_line(cal.coeffs, "no-such-gpu") is None


@pytest.mark.parametrize("device, n, k", [("l40s", 4096, 1024), ("l40s", 3072, 2048), ("h100-sxm", 4096, 1024)])
def test_an_l2_resident_shape_is_served_at_the_dram_line(device, n, k):
    cal = shipped_calibration(device)
    line = dram_line(cal.coeffs, device)
    nbytes = one_row_bytes(n, k)
    bench = predict([_row(device, 1, n, k)], cal)[0]
    served = matmul_operator(cal, "matmul", k, n).time(1, 2)
    assert bench < line.time(0.0, nbytes)              # the benchmark (L2) state is faster than DRAM ...
    assert served == pytest.approx(line.time(0.0, nbytes), rel=1e-9)  # ... serving pays the DRAM line


def test_the_benchmark_state_still_reproduces_its_rows():
    # predict (the held-out errors) prices the rows at the shape's own fit, with no floor
    cal = shipped_calibration("l40s")
    g = cal.regimes[matmul_key(4096, 1024)]   # the shape's two regimes (matmul_regimes.py)
    for m in (1, 8, 4096):
        flops, nbytes = 2.0 * m * 4096 * 1024, 2.0 * (m * 1024 + 4096 * 1024 + m * 4096)
        fitted = g.time(g.low.time(flops, nbytes, m), g.high.time(flops, nbytes, m), m)
        assert predict([_row("l40s", m, 4096, 1024)], cal)[0] == pytest.approx(fitted, rel=1e-12)


def test_large_batches_and_dram_shapes_keep_their_fit():
    cal = shipped_calibration("l40s")
    resident = matmul_operator(cal, "matmul", 1024, 4096)
    assert resident.dram_s_per_byte > 0
    unfloored = dataclasses.replace(resident, dram_s_per_byte=0.0, dram_extra_s=0.0)
    assert resident.time(4096, 2) == unfloored.time(4096, 2)   # compute-bound: the shape's fit
    assert resident.time(1, 2) > unfloored.time(1, 2)
    dram = matmul_operator(cal, "matmul", 2560, 4096)            # 20 MiB: timed from DRAM already
    assert (dram.dram_s_per_byte, dram.dram_extra_s) == (0.0, 0.0)
    # a shape priced from the operator or family coefficients (no grid) has no floor
    assert weight_floor({}, "l40s", 4096, 1024, cal.coeffs["matmul"]) == (0.0, 0.0)
    # a model layer's own shape off the grid (per-layer profiles: a real forward pass) has none either
    own = {**cal.coeffs, matmul_key(3000, 1000): cal.coeffs["matmul@3072x1024"]}
    assert weight_floor(own, "l40s", 3000, 1000, own[matmul_key(3000, 1000)]) == (0.0, 0.0)
    assert weight_floor(own, "l40s", 3072, 1024, own["matmul@3072x1024"])[0] > 0


def test_gpus_without_a_gemm_grid_are_unchanged():
    # LLMServingSim's per-layer profiles time a real forward pass (weights from DRAM): no grid, no floor
    for name in ("rtx-4090", "rtx-pro-6000@vllm-0.19"):
        cal = shipped_calibration(name)
        op = matmul_operator(cal, "qkv_proj", 4096, 6144)
        assert (op.dram_s_per_byte, op.dram_extra_s) == (0.0, 0.0)


def test_default_h100_llama_8b_shapes_are_not_l2_resident():
    # the README's default run (Llama-3.1-8B, TP 1 on H100): every weight is past 50 / 6 MiB
    for k, n in ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)):
        assert not weights_in_l2("h100-sxm", n, k)
    assert 6 * 2 * 4096 * 4096 > 50 * MIB


def test_a_small_model_on_l40s_decodes_slower_and_prefills_the_same():
    bench = load_benchmark("weights_l2")
    cm = make_cost_model("qwen2.5-0.5b", "l40s")
    assert [name for name in bench.MATMULS if getattr(cm, name).dram_s_per_byte] == ["qkv", "o", "down"]
    before, after = bench.step_times(bench.without_floor(cm)), bench.step_times(cm)
    assert after[0] > 1.05 * before[0]          # one decode: weight-bound, its small weights now from DRAM
    assert after[3] == before[3]                # a 2,048-token prefill: compute-bound, unchanged


def test_the_benchmark_script_runs(capsys):
    assert load_benchmark("weights_l2").main(["--gpu", "l40s", "--model", "qwen2.5-0.5b"]) == 0
    out = capsys.readouterr().out
    assert "l40s: DRAM line" in out and "floored: qkv, o, down" in out and "l40s fp8: DRAM line" in out


def _fp8_table(device: str) -> dict:
    from kernels_cost_model.modern_kernels import load_modern
    return load_modern(device)["gemm"]["fp8"]


def test_fp8_weights_are_resident_up_to_twice_the_elements():
    # l40s, 96 MiB: 4096 x 4096 is 32 MiB in bf16 (six copies 192 MiB: no) but 16 MiB in FP8 (96 MiB: fits)
    assert not weights_in_l2("l40s", 4096, 4096) and weights_in_l2("l40s", 4096, 4096, 1)
    assert not weights_in_l2("l40s", 4096, 5120, 1)


@pytest.mark.parametrize("device, n, k", [("l40s", 4096, 4096), ("l40s", 2048, 4096), ("h100-sxm", 4096, 1024)])
def test_an_l2_resident_fp8_shape_is_served_at_the_fp8_dram_line(device, n, k):
    import dataclasses

    from kernels_cost_model.modern_kernels import gemm_op
    from kernels_cost_model.operators import MatmulOp
    table = _fp8_table(device)
    # fitted over the FP8 shapes whose six 1-byte copies exceed the L2, in the fit's bytes (2 an element):
    # on the l40s 1,194 GB/s of those, i.e. ~600 GB/s of FP8 weight, as the bf16 line's 656
    line = dram_line(table, device, 1)
    assert line is not None and line.s_per_byte != dram_line(table, device, 2).s_per_byte
    nbytes = one_row_bytes(n, k)
    served = gemm_op(device, "fp8", MatmulOp(k * n, k + n, 0.0, 0.0, 0.0, 0.0), n, k)
    bench = dataclasses.replace(served, dram_s_per_byte=0.0, dram_extra_s=0.0)  # the shape's own fit
    assert served.dram_s_per_byte > 0
    assert bench.time(1, 2) < line.time(0.0, nbytes)               # the benchmark (L2) state is faster ...
    assert served.time(1, 2) == pytest.approx(line.time(0.0, nbytes), rel=1e-9)  # ... serving pays the line
    assert served.time(4096, 2) == bench.time(4096, 2)              # compute-bound: the shape's fit
    # past the L2 (six FP8 copies of 64 MiB): the shape's own fit, no floor
    big = gemm_op(device, "fp8", MatmulOp(8192 * 8192, 16384, 0.0, 0.0, 0.0, 0.0), 8192, 8192)
    assert (big.dram_s_per_byte, big.dram_extra_s) == (0.0, 0.0)


def test_an_fp8_model_decodes_slower_and_prefills_the_same():
    bench = load_benchmark("weights_l2")
    cm = make_cost_model("mistral-small-24b-fp8", "l40s", tensor_parallel_size=4)
    assert [name for name in bench.MATMULS if getattr(cm.base, name).dram_s_per_byte] == ["qkv", "o"]
    before, after = bench.step_times(bench.without_floor(cm)), bench.step_times(cm)
    assert after[0] > 1.01 * before[0] and after[1] > before[1]
    assert after[3] == before[3]


def test_derived_gemm_shapes_are_judged_by_their_donors_l2():
    from kernels_cost_model.derived_defaults import gemm_benchmark_device, shipped_defaults
    from kernels_cost_model.hardware import get_gpu
    d = shipped_defaults()
    # the largest L2 among the GPUs the group's GEMM shape keys come from (not the target's own)
    assert gemm_benchmark_device(get_gpu("l4"), d) == "l40s"              # ada: l40s 96 MiB, rtx-4090 72
    assert gemm_benchmark_device(get_gpu("h100-pcie"), d) == "h200"       # hopper: 50 MiB both, name breaks it
    assert gemm_benchmark_device(get_gpu("mi300x"), d) == "rtx-pro-6000"  # no group: all GPUs', 128 MiB
    assert gemm_benchmark_device(get_gpu("l4"), {}) is None


@pytest.mark.parametrize("name, n, k", [("l4", 4096, 1024), ("l40", 3072, 2048), ("h100-pcie", 4096, 1024)])
def test_an_uncalibrated_gpus_derived_l2_shape_is_served_at_its_dram_line(name, n, k):
    import dataclasses

    from kernels_cost_model.calibration import uncalibrated
    from kernels_cost_model.derived_defaults import GEMM_BENCHMARK_KEY
    from kernels_cost_model.hardware import get_gpu
    cal = uncalibrated(get_gpu(name))
    donor = cal.provenance[GEMM_BENCHMARK_KEY]
    assert weights_in_l2(donor, n, k) and matmul_key(n, k) in cal.coeffs
    line = dram_line(cal.coeffs, donor)   # the target's derived shapes past the donors' L2, at its datasheet
    served = matmul_operator(cal, "matmul", k, n)
    bench = dataclasses.replace(served, dram_s_per_byte=0.0, dram_extra_s=0.0)  # the derived (benchmark) fit
    assert bench.time(1, 2) < line.time(0.0, one_row_bytes(n, k))
    assert served.time(1, 2) == pytest.approx(line.time(0.0, one_row_bytes(n, k)), rel=1e-9)
    assert served.time(8192, 2) == bench.time(8192, 2)
    # the l4 streams 300 GB/s from its DRAM: its derived small-shape rate was past that, the line is not
    if name == "l4":
        assert one_row_bytes(n, k) / bench.time(1, 2) > 300e9 > 1.0 / line.s_per_byte


def test_an_uncalibrated_gpu_decodes_slower_and_prefills_the_same():
    bench = load_benchmark("weights_l2")
    with pytest.warns(UserWarning, match="no calibration shipped"):
        cm = make_cost_model("qwen2.5-0.5b", "l4")
    assert [name for name in bench.MATMULS if getattr(cm, name).dram_s_per_byte] == ["qkv", "o", "down"]
    before, after = bench.step_times(bench.without_floor(cm)), bench.step_times(cm)
    assert after[0] > 1.1 * before[0] and after[3] == before[3]


def test_a_left_out_gpu_is_judged_by_the_other_gpus_l2():
    from kernels_cost_model.derived_defaults import GEMM_BENCHMARK_KEY
    from kernels_cost_model.gpu_calibration import left_out_calibration
    assert left_out_calibration("l40s").provenance[GEMM_BENCHMARK_KEY] == "rtx-4090"  # ada without the l40s
