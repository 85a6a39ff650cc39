"""Defaults for uncalibrated GPUs derived from calibrated ones; CUDA-graph padding of batches."""
import dataclasses

import pytest

from kernels_cost_model import Calibration, Coeffs, make_cost_model
from kernels_cost_model.batch import BatchShape
from kernels_cost_model.calibration import uncalibrated
from kernels_cost_model.cuda_graph import capture_sizes
from kernels_cost_model.derived_defaults import (derive_defaults, derived_coeffs, group_of, shipped_defaults,
                                                 to_efficiency)
from kernels_cost_model.hardware import get_gpu
from kernels_cost_model.roofline import FAMILIES


def _cal(device: str, compute_eff: float, memory_eff: float) -> Calibration:
    gpu = get_gpu(device)
    c = Coeffs(1 / (gpu.bf16_flops_per_s * compute_eff), 1 / (gpu.hbm_bytes_per_s * memory_eff), 5e-6)
    grid = {f"matmul@{n}x{k}": c for n in (4096, 8192) for k in (4096, 8192)}  # a GEMM grid's shapes
    return Calibration(device, {f: c for f in FAMILIES} | grid, {"fitted_families": ["matmul"]})


def test_defaults_are_medians_of_the_same_architecture_as_fractions_of_peak():
    cals = {"h100-sxm": _cal("h100-sxm", 0.8, 0.9), "h200": _cal("h200", 0.6, 0.7),
            "a100-sxm-80gb": _cal("a100-sxm-80gb", 0.5, 0.5)}
    defaults = derive_defaults(cals, {d: get_gpu(d) for d in cals})
    hopper = defaults["groups"]["hopper"]["matmul"]
    assert hopper["compute"] == pytest.approx(0.7) and hopper["memory"] == pytest.approx(0.8)
    assert sorted(hopper["from"]) == ["h100-sxm", "h200"]
    assert "elementwise" not in defaults["all"]            # not fitted anywhere: no derived default
    pcie = get_gpu("h100-pcie")                             # a Hopper GPU with no calibration
    got = to_efficiency(derived_coeffs(pcie, defaults)["matmul"], pcie, "matmul")
    assert got["compute"] == pytest.approx(0.7) and got["memory"] == pytest.approx(0.8)
    ada = to_efficiency(derived_coeffs(get_gpu("l4"), defaults)["matmul@4096x4096"], get_gpu("l4"), "matmul")
    assert ada["compute"] == pytest.approx(0.6)             # no Ada GPU calibrated: all GPUs' median


def test_norms_and_activations_come_from_gpus_with_the_same_kind_of_memory():
    """Elementwise rates (mostly L2 over DRAM) follow the DRAM's family, not the architecture: a GDDR GPU
    takes the GDDR GPUs' median, an HBM Blackwell part the HBM GPUs', whatever their architecture."""
    def elementwise(device: str, memory_eff: float) -> Calibration:
        gpu = get_gpu(device)
        c = Coeffs(0.0, 1 / (gpu.hbm_bytes_per_s * memory_eff), 2e-6)
        return Calibration(device, {f: c for f in FAMILIES}, {"fitted_families": ["elementwise"]})
    cals = {"h100-sxm": elementwise("h100-sxm", 1.0), "h200": elementwise("h200", 1.2),
            "rtx-4090": elementwise("rtx-4090", 2.6), "rtx-pro-6000": elementwise("rtx-pro-6000", 2.4)}
    defaults = derive_defaults(cals, {d: get_gpu(d) for d in cals})
    assert sorted(defaults["groups"]["gddr"]["elementwise"]["from"]) == ["rtx-4090", "rtx-pro-6000"]
    for device, expected in (("l40s", 2.5), ("arc-pro-b60", 2.5), ("b200", 1.1), ("a100-sxm-80gb", 1.1)):
        gpu = get_gpu(device)
        l2_tier = derived_coeffs(gpu, defaults)["elementwise.rms_norm@l2"]
        assert to_efficiency(l2_tier, gpu, "elementwise")["memory"] == pytest.approx(expected), device
    assert group_of(get_gpu("b200"), "elementwise") == "hbm" and group_of(get_gpu("b200"), "matmul") == "blackwell"
    assert group_of(get_gpu("mi300x"), "elementwise.rms_norm@l2") == "hbm"
    blank = dataclasses.replace(get_gpu("l4"), memory_type="")  # the catalog does not say: its architecture
    assert group_of(blank, "elementwise") == "ada"


def test_a_model_layer_shape_off_any_grid_does_not_feed_the_defaults():
    cal = _cal("h100-sxm", 0.8, 0.9)
    own = Calibration("h200", {**_cal("h200", 0.6, 0.7).coeffs, "matmul@14336x4096": cal.coeffs["matmul"]},
                      {"fitted_families": ["matmul"]})
    defaults = derive_defaults({"h100-sxm": cal, "h200": own}, {d: get_gpu(d) for d in ("h100-sxm", "h200")})
    assert "matmul@4096x4096" in defaults["all"] and "matmul@14336x4096" not in defaults["all"]


def test_uncalibrated_gpus_use_the_shipped_derived_defaults():
    if not shipped_defaults():
        pytest.skip("no derived defaults shipped")
    gpu = get_gpu("h100-pcie")
    cal = uncalibrated(gpu)
    hopper = shipped_defaults()["groups"]["hopper"]["matmul"]
    assert to_efficiency(cal.coeffs["matmul"], gpu, "matmul")["compute"] == pytest.approx(hopper["compute"])
    assert cal.provenance["efficiencies"]["matmul"] == "derived default (hopper GPUs: h100-sxm, h200)"
    assert uncalibrated(gpu, derived=False).provenance["efficiencies"]["matmul"] == (0.70, 0.80, 6e-6)


def test_an_uncalibrated_gpu_names_the_gpus_its_efficiencies_come_from():
    """A GPU in no calibrated group (an AMD one) takes every calibrated GPU's figures, and says so,
    in its provenance and in the warning a plain run gives."""
    if not shipped_defaults():
        pytest.skip("no derived defaults shipped")
    defaults = shipped_defaults()
    source = uncalibrated(get_gpu("mi300x")).provenance["efficiencies"]
    assert source["matmul"] == f"derived default (all calibrated GPUs: {', '.join(defaults['all']['matmul']['from'])})"
    assert source["decode_attention"].startswith("derived default (all calibrated GPUs: ")
    with pytest.warns(UserWarning, match=r"'l4'.*\(matmul from ada GPUs: l40s, rtx-4090\)"):
        make_cost_model("llama-3.1-8b", "l4")


def test_capture_sizes_follow_vllm_defaults():
    sizes = capture_sizes(256)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (480, 496, 512) and 248 in sizes and 264 not in sizes
    assert capture_sizes(128)[-1] == 256 and capture_sizes(1) == (1, 2)
    assert capture_sizes(256, 96)[-1] == 96                              # never above the step budget
    # vLLM 0.33: up to 1024 on data-centre Blackwell, and the budget and batch size captured themselves
    assert capture_sizes(1024, 8192, "0.33", "10.0")[-1] == 1024 and capture_sizes(1024, 8192, "0.19", "10.0")[-1] == 512
    assert capture_sizes(1024, 8192, "0.33", "9.0")[-1] == 512
    assert 100 in capture_sizes(100, 2048, "0.33") and 100 not in capture_sizes(100, 2048, "0.19")
    assert 300 in capture_sizes(256, 300, "0.33") and 300 not in capture_sizes(256, 300, "0.19")


def test_capture_sizes_widen_to_speculative_decode_rows():
    """A decode row verifies 1 + k tokens: the largest size is 2 x max_num_seqs x (1 + k) (capped), and vLLM
    0.33 captures each uniform decode batch of n rows, n x (1 + k) tokens (n = 1, 2, 4, 8.., max_num_seqs)."""
    assert capture_sizes(64, 8192, "0.19")[-1] == 128 and capture_sizes(64, 8192, "0.19", "", False, 3)[-1] == 512
    new, old = capture_sizes(60, 8192, "0.33", "9.0", False, 2), capture_sizes(60, 8192, "0.19", "", False, 2)
    assert new[-1] == old[-1] == 352                                        # on the grid below 2 x 60 x 3
    assert {3, 6, 12, 180} <= set(new) and not {3, 6, 12, 180} & set(old)   # 1, 2, 4 and all 60 rows x 3 tokens
    assert 9 not in new                                                     # 3 rows: not on the request grid
    assert capture_sizes(60, 200, "0.33", "9.0", False, 2)[-1] == 200       # never above the step budget
    spec = make_cost_model("llama-3.1-8b", "h100", max_num_seqs=60, max_num_batched_tokens=8192,
                           num_speculative_tokens=3)
    assert spec.cuda_graph_sizes[-1] == 480 and 240 in spec.cuda_graph_sizes


def test_batches_are_padded_to_the_next_capture_size_and_not_beyond_it():
    def qkv(n: int, eager: bool = False) -> float:
        cm = make_cost_model("llama-3.1-8b", "h100", calibration=None, enforce_eager=eager)
        return cm.breakdown(BatchShape([1] * n, [100] * n, n))["qkv_proj"]
    assert qkv(9) == qkv(16) and qkv(9, eager=True) < qkv(16, eager=True)
    assert qkv(600) == qkv(600, eager=True)                 # above the largest captured size: eager


@pytest.mark.parametrize("name, nvlink", [("h100-sxm", True), ("a100-sxm-80gb", True), ("b200", True),
                                          ("rtx-pro-6000", False), ("rtx-4090", False), ("l40s", False),
                                          ("a100-pcie-80gb", False), ("h100-pcie", False)])
def test_pcie_hosts_are_not_nvlink_even_when_their_note_mentions_nvlink(name, nvlink):
    gpu = get_gpu(name)
    assert gpu.has_nvlink is nvlink
    assert group_of(gpu, "all_reduce") == ("nvlink" if nvlink else "pcie")


def test_the_engines_max_num_seqs_sets_the_capture_sizes_a_deployment_pads_to():
    from sim.api.cost_setup import build_cost_model
    from sim.api.sections import DeploymentConfig
    from sim.core.config import EngineConfig
    d = DeploymentConfig(model="llama-3.1-8b", gpu="h100")
    assert build_cost_model(d, EngineConfig(max_num_seqs=16)).cuda_graph_sizes == capture_sizes(16)
    b200 = DeploymentConfig(model="llama-3.1-8b", gpu="b200")
    resolved = EngineConfig(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=8192)
    assert build_cost_model(b200, resolved).cuda_graph_sizes[-1] == 1024        # the newest profile: 0.33
    older = EngineConfig(max_model_len=8192, max_num_seqs=1024, max_num_batched_tokens=8192,
                         scheduler_profile="vllm-0.19")
    assert build_cost_model(b200, older).cuda_graph_sizes[-1] == 512
    assert build_cost_model(d).cuda_graph_sizes == capture_sizes(256)     # no engine: vLLM's default
    small, default = build_cost_model(d, EngineConfig(max_num_seqs=16)), build_cost_model(d)
    batch = BatchShape([1] * 36, [100] * 36, 36)   # 36 tokens: padded to 40 at 256 seqs, eager at 16
    assert small.breakdown(batch)["qkv_proj"] < default.breakdown(batch)["qkv_proj"]


def test_attention_defaults_are_grouped_by_the_kernels_vllm_runs():
    from kernels_cost_model.derived_defaults import attention_kernels
    kernels = {name: attention_kernels(get_gpu(name)) for name in
               ("a100-sxm-80gb", "l40s", "rtx-4090", "rtx-pro-6000", "h100-sxm", "b200")}
    assert kernels == {"a100-sxm-80gb": "fa2", "l40s": "fa2", "rtx-4090": "fa2", "rtx-pro-6000": "fa2",
                       "h100-sxm": "hopper", "b200": "blackwell"}
    assert group_of(get_gpu("rtx-pro-6000"), "prefill_attention@64/8/128") == "fa2"
    assert group_of(get_gpu("rtx-pro-6000"), "matmul") == "blackwell"
    fa2 = shipped_defaults()["groups"]["fa2"]
    assert set(fa2["prefill_attention"]["from"]) == {"a100-sxm-80gb", "l40s", "rtx-4090", "rtx-pro-6000"}


def test_blackwell_ultra_prices_attention_from_its_own_kind_and_gemms_with_all_blackwell():
    from kernels_cost_model.derived_defaults import attention_kernels
    assert [attention_kernels(get_gpu(n)) for n in ("b200", "gb200", "b300", "gb300")] == \
        ["blackwell", "blackwell", "blackwell-ultra", "blackwell-ultra"]
    groups = shipped_defaults()["groups"]
    assert groups["blackwell-ultra"]["prefill_attention"]["from"] == ["b300", "gb300"]
    assert groups["blackwell"]["prefill_attention"]["from"] == ["b200", "gb200"]
    assert group_of(get_gpu("b300"), "matmul") == "blackwell"          # its GEMMs: the same tensor cores
    assert "b300" in groups["blackwell"]["matmul"]["from"]


def test_a_gemm_shape_key_never_prices_outside_the_fits_it_comes_from():
    # The Blackwell fits of matmul@5120x5120 before the GEMM refit: each trades its bandwidth term
    # against tile rows; field-by-field medians (bandwidth 0.28: two fitted-away terms read as 0) price
    # a decode row slower than every one of them.
    from kernels_cost_model.derived_defaults import CHECK_ROWS, _gemm_time, from_efficiency
    key = "matmul@5120x5120"
    fits = {"b200": (0.8271, 0.0, 5.99e-6, 212.5), "b300": (0.7733, 0.5509, 0.0, 87.68),
            "gb200": (0.8198, 0.0, 5.9e-6, 230.5), "gb300": (0.8429, 2.3967, 9.43e-6, 0.0)}
    cals = {}
    for d, (ce, me, ov, tile) in fits.items():
        e = {"compute": ce, "memory": me, "overhead_s": ov, "tile_rows": tile, "s_per_seq": 0.0, "s_per_key": 0.0}
        c = from_efficiency(e, get_gpu(d), key)
        grid = {f"matmul@{n}x{k}": c for n in (4096, 5120) for k in (4096, 5120)}  # key is a grid point
        cals[d] = Calibration(d, {f: c for f in FAMILIES} | grid, {"fitted_families": ["matmul"]})
    got = derive_defaults(cals, {d: get_gpu(d) for d in cals})["groups"]["blackwell"][key]
    own = {d: (e[1], e[3]) for d, e in fits.items()}
    assert (got["memory"], got["tile_rows"]) in [(pytest.approx(m, rel=1e-3), pytest.approx(t, rel=1e-3))
                                                for m, t in own.values()]          # one GPU's whole fit
    ref = get_gpu("b200")
    for r in CHECK_ROWS:
        times = [_gemm_time(key, {"compute": c, "memory": m, "overhead_s": o, "tile_rows": t}, ref.bf16_flops_per_s,
                            ref.hbm_bytes_per_s, r) for c, m, o, t in fits.values()]
        assert min(times) * 0.999 <= _gemm_time(key, got, ref.bf16_flops_per_s, ref.hbm_bytes_per_s, r) <= max(times) * 1.001


def test_the_shipped_matmul_family_defaults_price_within_the_fits_they_come_from():
    # The Ada family default was once the field-by-field median of the L40S's fit (no bandwidth term:
    # tile rows stand in for it) and the RTX 4090's (94 % of bandwidth): bandwidth 0.47, a decode-row
    # GEMM priced slower than on either GPU. The family key takes the same guard as the shape keys.
    from kernels_cost_model.calibration import shipped_calibration
    from kernels_cost_model.derived_defaults import CHECK_ROWS, FAMILY_CHECK_KEY, _gemm_time
    from statistics import median
    for group, keys in shipped_defaults()["groups"].items():
        if "matmul" not in keys:
            continue
        sources = [get_gpu(d) for d in keys["matmul"]["from"]]
        flops = median(g.bf16_flops_per_s for g in sources)
        bandwidth = median(g.hbm_bytes_per_s for g in sources)
        own = [to_efficiency(shipped_calibration(g.name).coeffs["matmul"], g, "matmul") for g in sources]
        for r in CHECK_ROWS:
            times = [_gemm_time(FAMILY_CHECK_KEY, e, flops, bandwidth, r) for e in own]
            got = _gemm_time("matmul", keys["matmul"], flops, bandwidth, r)
            assert min(times) * 0.99 <= got <= max(times) * 1.01, (group, r)
    assert shipped_defaults()["groups"]["ada"]["matmul"]["memory"] > 0.9   # the RTX 4090's whole fit


def test_a_moe_fits_cost_per_routed_row_carries_over_at_the_bandwidth_of_the_gpu():
    from kernels_cost_model.derived_defaults import from_efficiency
    b200, pro = get_gpu("b200"), get_gpu("rtx-pro-6000")
    fitted = Coeffs(1e-15, 1e-13, 5e-6, 4.0, 2e-9)
    carried = from_efficiency(to_efficiency(fitted, b200, "moe"), pro, "moe")
    # the per-row kernels stream the rows: a GPU with less memory bandwidth pays more per row
    assert carried.s_per_seq == pytest.approx(2e-9 * b200.hbm_bytes_per_s / pro.hbm_bytes_per_s)
    attention = from_efficiency(to_efficiency(fitted, b200, "decode_attention"), pro, "decode_attention")
    assert attention.s_per_seq == pytest.approx(2e-9)     # a launch's per-sequence cost is carried as fitted


def test_a_speculative_run_builds_its_cost_model_with_its_drafts():
    from sim.api.cost_setup import build_cost_model
    from sim.api.simulator import SimulationConfig
    from sim.core.speculative import SpeculativeConfig
    config = SimulationConfig().replace(engine={"max_num_seqs": 60, "max_model_len": 8192})
    plain = build_cost_model(config.deployment, config.engine)
    spec = build_cost_model(config.deployment, config.engine, SpeculativeConfig(num_speculative_tokens=3))
    assert plain.cuda_graph_sizes[-1] == 120 and spec.cuda_graph_sizes[-1] == 480
