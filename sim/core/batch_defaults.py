"""vLLM's step budget and batch size when the user sets neither: they depend on the GPU, the entry point
and the release.

vLLM (`EngineArgs.get_batch_defaults` and `_set_default_max_num_seqs_and_batched_tokens_args` in
vllm/engine/arg_utils.py) fills an unset `max_num_batched_tokens` and `max_num_seqs` from a table keyed by
the usage context (which entry point built the engine) and the device's total memory (budget / sequences):

| device | `vllm serve` (openai_api_server) | `LLM(...)`, offline (llm_class) |
|---|---|---|
| >= 160 GiB (B200, B300, MI300X), vLLM 0.33 only | 16384 / 1024 | 16384 / 1024 |
| >= 70 GiB and not an A100 (H100, H200, RTX PRO 6000; 0.33: not a GB10 either) | 8192 / 1024 | 16384 / 1024 |
| the rest (A100, L40S, L4, RTX 4090, ...) | 2048 / 256 | 8192 / 256 |

Any other entry point (an `AsyncLLM` built directly: engine_context) takes `SchedulerConfig`'s class
defaults, 2048 / 128, on every device. Then, for a defaulted budget: without chunked prefill at least
`max_model_len`, and at most `max_num_seqs x max_model_len`; for defaulted sequences: at most the budget.
`--performance-mode throughput` doubles both defaults first.
The device memory is the total CUDA reports. The release is the scheduler profile's
(sim.core.scheduler_profiles: 0.19 or 0.33).
"""
from __future__ import annotations

import dataclasses

#: vLLM's UsageContext values, lower-cased, that the defaults tell apart (a third stands for the rest).
USAGE_CONTEXTS = ("openai_api_server", "llm_class", "engine_context")
#: vLLM's `--performance-mode` values: "throughput" doubles the defaulted budget and batch size,
#: "interactivity" captures CUDA graphs at every batch size up to 32 (kernels_cost_model/cuda_graph.py).
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
#: A simulation's entry point unless told otherwise: `vllm serve`.
DEFAULT_USAGE_CONTEXT = "openai_api_server"
#: Devices with at least this much memory, A100s excepted, get the larger defaults (vLLM: "For GPUs like
#: H100 and MI300x"; A100s keep the smaller budget, vLLM PR #17885: a larger one lowered their throughput).
LARGE_DEVICE_BYTES = 70 * 2**30
#: vLLM 0.33's top tier ("for GPUs like B200/B300 with >= 160GB memory, use the largest defaults").
HUGE_DEVICE_BYTES = 160 * 2**30
#: (max_num_batched_tokens, max_num_seqs) by usage context, per device tier.
HUGE_DEVICE = {"openai_api_server": (16384, 1024), "llm_class": (16384, 1024)}
LARGE_DEVICE = {"openai_api_server": (8192, 1024), "llm_class": (16384, 1024)}
OTHER_DEVICE = {"openai_api_server": (2048, 256), "llm_class": (8192, 256)}
#: Releases whose tables have the 160 GiB tier and keep GB10 (DGX Spark, compute capability 12.1: the
#: memory but not the compute of a large GPU) on the small tier.
HUGE_TIER_RELEASES = ("0.33",)
#: SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS and DEFAULT_MAX_NUM_SEQS: any other usage context.
CLASS_DEFAULTS = (2048, 128)
#: An engine run on its own, with no GPU to read (engine-level runs, tests): servesim's fixed defaults,
#: and the budget's floor without chunked prefill (then at least max_model_len).
NO_DEVICE = (8192, 256)
NO_DEVICE_UNCHUNKED = 2048


def batch_defaults(usage_context: str, total_memory_bytes: int, gpu_name: str, release: str = "0.33",
                   compute_capability: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) the vLLM `release` (major.minor) would
    default to for this entry point and device."""
    newer = release in HUGE_TIER_RELEASES
    if newer and total_memory_bytes >= HUGE_DEVICE_BYTES:
        table = HUGE_DEVICE
    elif (total_memory_bytes >= LARGE_DEVICE_BYTES and "a100" not in gpu_name.lower()
          and not (newer and compute_capability == "12.1")):
        table = LARGE_DEVICE
    else:
        table = OTHER_DEVICE
    return table.get(usage_context, CLASS_DEFAULTS)


def with_batch_defaults(engine, budget: int, seqs: int):
    """`engine` (an EngineConfig with a max_model_len) with its unset step budget and batch size taken
    from the defaults `budget` and `seqs` under vLLM's rules (the module docstring); set ones are kept."""
    updates = {}
    length = engine.max_model_len
    if engine.performance_mode == "throughput":  # (vLLM doubles the defaults, before the rules below)
        budget, seqs = 2 * budget, 2 * seqs
    if engine.max_num_batched_tokens is None:
        tokens = budget if engine.enable_chunked_prefill else max(length, budget)
        seats = seqs if engine.max_num_seqs is None else engine.max_num_seqs
        updates["max_num_batched_tokens"] = min(seats * length, tokens)
    if engine.max_num_seqs is None:
        updates["max_num_seqs"] = min(seqs, updates.get("max_num_batched_tokens", engine.max_num_batched_tokens))
    return dataclasses.replace(engine, **updates) if updates else engine
