"""`make_cost_model`: a model, a GPU and their settings in, a frozen RooflineCostModel out.

It does all the work up front (catalog lookups, calibration, per-GPU shapes, collective curves, CUDA-graph
sizes) so that `RooflineCostModel.step_time` (cost_model.py) only folds a batch and prices it.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from kernels_cost_model.errors import ConfigError, is_int, is_number, require

from . import mixed_launch as _ml
from .calibration import Calibration, load_calibration, shipped_calibration, uncalibrated
from .cost_model import BREAKDOWN_KEYS, CPU_PER_REQUEST_S, RooflineCostModel
from .cuda_graph import capture_sizes, serves_with_graphs
from .derived_defaults import derived_coeffs, donors, shipped_defaults
from .derived_mechanisms import decode_imbalance_for, mixed_decode_for
from .expert_sharding import expert_sharded
from .hardware import GPU, get_gpu
from .interconnect import host_gpu
from .l2_cache import ElementwiseOp, elementwise_op
from .layer_ops import shaped_cost_model
from .models import ModelSpec, get_model
from .operators import MatmulOp, all_reduce_curve, attention_operator, matmul_operator, moe_operator
from .power_cap import CLOCKS, at_clocks
from .prefill_waves import fa2_sms, key_block
from .roofline import Coeffs


def _mixed_launch_of(hw: GPU, mixed_decode: tuple) -> tuple:
    """RooflineCostModel.mixed_launch for `hw`: FA2 GPUs with the mixed-batch mechanism and a known L2."""
    from .l2_cache import l2_bytes
    l2 = l2_bytes(hw.name)
    if not (mixed_decode[0] and fa2_sms(hw.name) and l2):
        return ()
    return (float(l2), 1.0 / (_ml.DRAM_EFFICIENCY * hw.hbm_bytes_per_s))


def link_all_reduce(host: GPU) -> Coeffs:
    """All-reduce on a host whose link is not the catalog's: the measured efficiency of calibrated GPUs
    on that kind of link (derived_defaults.py groups), at the link's rate."""
    return derived_coeffs(host, shipped_defaults(), families=("all_reduce",), shapes=False)["all_reduce"]


def _efficiency_source(gpu: GPU) -> str:
    """'efficiencies derived from calibrated GPUs (matmul from ada GPUs: l40s, rtx-4090)'."""
    found = donors(gpu, shipped_defaults(), "matmul") if shipped_defaults() else None
    if found is None:
        return "typical efficiencies (no derived defaults shipped)"
    return f"efficiencies derived from calibrated GPUs (matmul from {found})"


def _resolve_calibration(gpu: GPU, calibration: str | Path | Calibration | None) -> Calibration:
    if isinstance(calibration, Calibration):
        return calibration
    if calibration is None:
        return uncalibrated(gpu)
    if str(calibration) == "default":
        cal = shipped_calibration(gpu.name)
        if cal is None:
            cal = uncalibrated(gpu)
            warnings.warn(f"no calibration shipped for GPU {gpu.name!r}: priced at its datasheet peaks with "
                          f"{_efficiency_source(gpu)}; docs/cost_model.md, 'GPUs with no calibration', gives "
                          "the error to expect", stacklevel=3)
            return cal
        return cal
    named = shipped_calibration(str(calibration)) if "@" in str(calibration) else None
    if named is not None:  # a named shipped variant, e.g. rtx-pro-6000@vllm-0.19
        require(named.device == gpu.name, "calibration", str(calibration),
                f"is a calibration of {named.device}, not of {gpu.name}")
        return named
    require(Path(calibration).is_file(), "calibration", str(calibration),
            "neither a shipped calibration nor a calibration JSON file (give default, one of the shipped variants:"
            f" {', '.join(shipped_variants())}, or a file written by servesim calibrate)")
    cal = load_calibration(calibration)
    if _gpu_name(cal.device) != gpu.name:
        warnings.warn(f"calibration={str(calibration)!r} was fitted on {cal.device}, not {gpu.name}: step times"
                      f" follow {cal.device}'s kernels", stacklevel=3)
    return cal


def _gpu_name(device: str) -> str:
    """The catalog name of a calibration's device ("h100" -> "h100-sxm"); the name itself if not a GPU."""
    try:
        return get_gpu(device).name
    except ConfigError:
        return device


def shipped_variants() -> list[str]:
    """Names of the shipped named calibrations (`<gpu>@<tag>`), for `calibration=NAME`."""
    from importlib import resources
    folder = resources.files("kernels_cost_model").joinpath("data", "calibration")
    return sorted(p.name[:-5] for p in folder.iterdir() if "@" in p.name and p.name.endswith(".json"))


def _check_switches(**switches) -> None:
    """make_cost_model's on/off arguments: each True or False (a string such as "no" would read as on)."""
    for name, value in switches.items():
        require(isinstance(value, bool), name, value, "must be true or false")


def make_cost_model(model: str | Path | ModelSpec, gpu: str | GPU, tensor_parallel_size: int = 1, *,
                    calibration: str | Path | Calibration | None = "default",
                    cpu_overhead: bool = True, async_scheduling: bool = False,
                    collective_scale: float = 1.0, cpu_per_request_s: float | None = None,
                    max_num_seqs: int = 256, enforce_eager: bool = False, max_model_len: int | None = None,
                    max_num_batched_tokens: int | None = None, vllm_release: str = "0.33",
                    performance_mode: str = "balanced",
                    kv_cache_dtype: str = "auto",
                    enable_expert_parallel: bool = False,
                    interconnect: str | None = "auto", num_speculative_tokens: int = 0,
                    clocks: str = "burst") -> RooflineCostModel:
    """Cost model of `model` on `tensor_parallel_size` x `gpu`.

    calibration: "default" = the fit shipped for this GPU (or the uncalibrated roofline with a
    warning when none ships); None = uncalibrated roofline; "<gpu>@<tag>" = a named shipped variant of
    this GPU (e.g. rtx-pro-6000@vllm-0.19, `shipped_variants()`); a path = a calibration JSON file.
    async_scheduling, collective_scale, cpu_per_request_s: see the RooflineCostModel fields (None =
    the default CPU_PER_REQUEST_S).
    max_num_seqs, max_num_batched_tokens (None: no cap), enforce_eager, vllm_release (major.minor),
    performance_mode (vLLM's; "interactivity" captures every size up to 32), num_speculative_tokens (the
    drafts a decode row verifies): the engine's; they set the CUDA-graph padding (cuda_graph.py; none on
    a platform that serves eagerly, e.g. Intel's XPU before vLLM 0.33).
    max_model_len: the engine's (None: the model's own maximum, as vLLM); on FA2 GPUs a captured decode
    graph's split-KV count is decided at it (prefill_waves.decode_path).
    kv_cache_dtype: "auto" or "fp8" (picks the measured MLA kernels of that KV dtype, modern_kernels.py).
    enable_expert_parallel: shard a MoE model's experts over the TP ranks (expert_sharding.py).
    interconnect: "auto" (the catalog's link), "nvlink" or "pcie": the host's link (interconnect.py).
    clocks: "burst" (the kernel tables' own clocks) or "sustained" (a GPU kept at its power cap by
    compute-heavy work: compute at the clock the cap holds, where measured; power_cap.py).
    """
    require(is_number(collective_scale) and collective_scale > 0, "collective_scale", collective_scale, "must be > 0")
    cpu_per_request_s = CPU_PER_REQUEST_S if cpu_per_request_s is None else cpu_per_request_s
    require(is_number(cpu_per_request_s) and 0 <= cpu_per_request_s < 1, "cpu_per_request_s", cpu_per_request_s,
            "must be in [0, 1) seconds")
    require(max_model_len is None or (is_int(max_model_len) and max_model_len >= 1), "max_model_len",
            max_model_len, "must be an integer >= 1 (or None: the model's own maximum)")
    _check_switches(cpu_overhead=cpu_overhead, async_scheduling=async_scheduling, enforce_eager=enforce_eager,
                    enable_expert_parallel=enable_expert_parallel)
    require(is_int(max_num_seqs) and max_num_seqs >= 1, "max_num_seqs", max_num_seqs, "must be an integer >= 1")
    require(max_num_batched_tokens is None or (is_int(max_num_batched_tokens) and max_num_batched_tokens >= 1),
            "max_num_batched_tokens", max_num_batched_tokens, "must be an integer >= 1 (or None)")
    require(kv_cache_dtype in ("auto", "fp8"), "kv_cache_dtype", kv_cache_dtype, "must be one of auto, fp8")
    require(clocks in CLOCKS, "clocks", clocks, f"must be one of {', '.join(CLOCKS)}")
    require(is_int(num_speculative_tokens) and num_speculative_tokens >= 0, "num_speculative_tokens",
            num_speculative_tokens, "must be an integer >= 0")
    require(calibration is None or isinstance(calibration, (str, Path, Calibration)), "calibration", calibration,
            "must be \"default\", None, a shipped variant name, a calibration JSON path or a Calibration")
    spec, hw = get_model(model), get_gpu(gpu)
    tp = tensor_parallel_size
    require(is_int(tp) and tp >= 1, "tensor_parallel_size", tp, "must be an integer >= 1")
    require(spec.num_heads % tp == 0, "tensor_parallel_size", tp,
            f"must divide num_heads={spec.num_heads} of {spec.name}")
    require(spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0, "tensor_parallel_size", tp,
            f"must divide or be a multiple of num_kv_heads={spec.num_kv_heads} of {spec.name}")
    cal, clock_factor = at_clocks(_resolve_calibration(hw, calibration), hw.name, clocks)
    host = host_gpu(hw, interconnect)
    (mixed_decode, mixed_from), (imbalance, imbalance_from) = mixed_decode_for(hw), decode_imbalance_for(hw)
    own_host = host is hw  # collectives at this host's measured curves, else at its link's class

    def co(family: str, op: str) -> ElementwiseOp:
        return elementwise_op(cal.coeffs, hw.name, op)

    def mm(op: str, k: float, n: float) -> MatmulOp:
        return matmul_operator(cal, op, k, n)

    h, hd = spec.hidden_size, spec.head_dim
    q_gpu = spec.q_dim / tp
    kv_gpu = max(1, spec.num_kv_heads // tp) * hd
    inter = (spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size) / tp
    heads, kv_heads = spec.num_heads / tp, max(1, spec.num_kv_heads // tp)
    plain = RooflineCostModel(
        model=spec, gpu=host, tensor_parallel_size=tp, calibration=cal, cpu_overhead=cpu_overhead,
        layers=float(spec.num_layers), dtype_bytes=float(spec.dtype_bytes), hidden=float(h),
        q_gpu=q_gpu, kv_gpu=float(kv_gpu), heads_gpu_x_hd=q_gpu, inter_gpu=inter,
        experts=float(spec.num_experts), top_k=float(spec.num_experts_per_tok),
        qkv=mm("qkv_proj", h, q_gpu + 2 * kv_gpu), o=mm("o_proj", q_gpu, h),
        up=mm("mlp_up", h, 2 * inter), down=mm("mlp_down", inter, h),
        router=mm("moe_router", h, spec.num_experts) if spec.is_moe else None,
        lm_head=mm("lm_head", h, spec.vocab_size / tp),
        prefill=attention_operator(cal, "prefill_attention", heads, kv_heads, hd),
        decode=attention_operator(cal, "decode_attention", heads, kv_heads, hd),
        norm=co("elementwise", "rms_norm"), act=co("elementwise", "silu_mul"),
        rope=co("elementwise", "rope"), add=co("elementwise", "add"),
        embed=co("elementwise", "embedding"),
        all_reduce=cal.coeffs["all_reduce"] if own_host else link_all_reduce(host),
        mixed_decode=mixed_decode,
        all_reduce_curve=all_reduce_curve(cal, hw.name, tp, "all_reduce") if own_host else None,
        all_gather_curve=all_reduce_curve(cal, hw.name, tp, "all_gather") if own_host else None,
        fused_moe=moe_operator(cal, h, inter, spec.num_experts, spec.num_experts_per_tok) if spec.is_moe else None,
        async_scheduling=bool(async_scheduling), collective_scale=float(collective_scale),
        cpu_per_request_s=float(cpu_per_request_s),
        cuda_graph_sizes=(capture_sizes(max_num_seqs, max_num_batched_tokens, str(vllm_release), hw.compute_capability,
                                        performance_mode == "interactivity", num_speculative_tokens)
                          if serves_with_graphs(hw, enforce_eager, str(vllm_release)) else ()),
        decode_imbalance=imbalance,
        prefill_waves=(fa2_sms(hw.name), heads, key_block(hd)),
        decode_waves=(fa2_sms(hw.name), heads, float(kv_heads), key_block(hd),
                      -(-(max_model_len or spec.max_position_embeddings) // key_block(hd))),
        mechanism_sources=(("mixed_decode", mixed_from), ("decode_imbalance", imbalance_from)),
        mixed_launch=_mixed_launch_of(hw, mixed_decode), qk_norm_layers=float(spec.qk_norm_layers),
        compute_clock_factor=clock_factor,
    )
    if enable_expert_parallel:
        plain = expert_sharded(plain)
    if spec.is_plain:
        return plain
    measured = isinstance(calibration, str) and calibration == "default"  # shipped modern fits with shipped cal
    return shaped_cost_model(plain, BREAKDOWN_KEYS, kv_cache_dtype, measured)  # layer_ops.py
