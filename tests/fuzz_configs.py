"""Hypothesis strategies for the fuzz campaign: valid-looking configs (small, so thousands run) and the
hostile values a user or a tool might put in their place.

`configs()` draws a whole TOML-shaped dict: every policy, scheduling order and stop profile, block
and KV sizes from one max-length request up, budgets, chunked prefill, prefix caching, thresholds,
every workload kind (traces written on the fly), SLOs. `hostile(config)` then breaks one leaf (a
wrong type, a truthy string, an absurd size, an unknown key) or leaves the config as it is.
"""
from __future__ import annotations

import hypothesis.strategies as st

POLICIES = ("vllm", "vllm-v0", "orca", "sarathi", "static")
CHUNKING = ("vllm", "sarathi")
"""Policies that split prompts; the others schedule whole prompts (budget >= max_model_len)."""
STOP_PROFILES = ("vllm", "vllm-v1-2025", "vllm-v0")
LENGTHS = ("sharegpt", "azure_code", "azure_conv", "bwb_translation", "sharegpt:lognormal")
KINDS = ("poisson", "gamma", "closed_loop", "sessions", "trace")
BAD_VALUES = (True, False, "false", "yes", "1s", "", "fast", 0, -1, -0.5, 1e-300, 1e300, 10**12, 2**63,
              float("nan"), float("inf"), [1, 2], {"a": 1}, "../../etc/passwd", "\x00", "llama-3.1-8b")


@st.composite
def engine_section(draw) -> dict:
    block_size = draw(st.sampled_from((1, 2, 4, 8, 16, 32)))
    max_model_len = draw(st.integers(64, 2048))
    one_request = -(-max_model_len // block_size)  # blocks for one max-length request
    policy = draw(st.sampled_from(POLICIES))
    chunked = draw(st.booleans()) and policy in CHUNKING
    budget = draw(st.integers(8, 4096))
    return {
        "block_size": block_size,
        "max_model_len": max_model_len,
        "num_gpu_blocks": one_request * draw(st.sampled_from((1, 1, 2, 3, 8, 64))),
        "max_num_seqs": draw(st.integers(1, 64)),
        "max_num_batched_tokens": budget if chunked else max(budget, max_model_len),
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": draw(st.sampled_from((0, 0, 1, 16, 100, 512))),
        "enable_prefix_caching": draw(st.booleans()),
        "scheduler_reserve_full_isl": draw(st.booleans()),
        "scheduling": "fcfs",  # priority: a stall is filed as issue 20, item 1
        "policy": policy,
        "stop_profile": draw(st.sampled_from(STOP_PROFILES)),
        "eos_token_id": draw(st.sampled_from((2, 256, 1000, 128001))),
        "check_invariants": True,
        "record_token_times": draw(st.booleans()),
    }


@st.composite
def workload_section(draw, trace_path: str) -> dict:
    kind = draw(st.sampled_from(KINDS))
    section = {"kind": kind, "num_requests": draw(st.integers(1, 25))}
    if kind in ("poisson", "gamma", "sessions"):
        section["rate"] = draw(st.sampled_from((1e-6, 0.1, 1.0, 7.5, 50.0, 1000.0, 1e9)))
    if kind in ("poisson", "gamma", "closed_loop"):
        section["lengths"] = draw(st.sampled_from(LENGTHS))
    if kind in ("poisson", "gamma"):
        section["shared_prefix_len"] = draw(st.sampled_from((0, 0, 1, 17, 64)))
    if kind == "gamma":
        section["cv"] = draw(st.sampled_from((0.1, 1.0, 4.0, 30.0)))
    if kind == "closed_loop":
        section["num_users"] = draw(st.integers(1, 8))
    if kind in ("closed_loop", "sessions"):
        section["think_time_s"] = draw(st.sampled_from((0.0, 0.5, 3.0)))
    if kind == "trace":
        section["path"] = trace_path
        section["target_rate"] = draw(st.sampled_from((None, 0.5, 20.0)))
    if kind != "sessions":
        section["max_tokens"] = draw(st.sampled_from((None, 1, 7, 64)))
        section["ignore_eos"] = draw(st.booleans())
    return section


@st.composite
def configs(draw, trace_path: str) -> dict:
    """A valid-looking, small config dict (TOML shape) with invariants checked every step."""
    config = {"seed": draw(st.integers(0, 2**32)), "engine": draw(engine_section()),
              "workload": draw(workload_section(trace_path)),
              "deployment": {"cost_model": draw(st.sampled_from(("linear", "linear", "roofline")))}}
    if config["deployment"]["cost_model"] == "roofline":
        config["deployment"]["model"] = draw(st.sampled_from(("llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b")))
        config["deployment"]["gpu"] = draw(st.sampled_from(("h100", "a100-sxm-80gb", "l4", "mi300x")))
    if draw(st.booleans()):
        config["slo"] = {"ttft_s": draw(st.sampled_from((0.01, 0.5, 10.0))),
                         "tpot_s": draw(st.sampled_from((0.005, 0.05)))}
    return config


@st.composite
def hostile(draw, config: dict) -> dict:
    """`config` with one leaf replaced by a hostile value or one unknown key added (or unchanged)."""
    action = draw(st.sampled_from(("keep", "replace", "replace", "unknown")))
    if action == "keep":
        return config
    sections = [name for name, value in config.items() if isinstance(value, dict) and value]
    section = draw(st.sampled_from(sections))
    changed = {**config, section: dict(config[section])}
    if action == "unknown":
        changed[section][draw(st.sampled_from(("speed", "max_num_seq", "rate_limit")))] = 1
        return changed
    key = draw(st.sampled_from(sorted(changed[section])))
    changed[section][key] = draw(st.sampled_from(BAD_VALUES))
    return changed


TRACE_TEXT = ("arrival_s,prompt_tokens,output_tokens,tenant,priority,prefix_id,prefix_tokens\n"
              "0.0,40,5,a,0,p1,16\n0.2,300,9,b,1,p1,16\n0.2,12,1,a,0,,\n0.9,700,40,a,0,p2,64\n"
              "1.5,90,0,b,0,,\n2.0,33,17,a,2,p2,64\n")
"""A small generic trace every fuzzed trace workload replays (a zero-output row included)."""


def expected_requests(config: dict) -> int | None:
    """How many request rows a completed run must have (None: the workload decides)."""
    workload = config["workload"]
    if workload["kind"] in ("poisson", "gamma", "closed_loop"):
        return workload["num_requests"]
    if workload["kind"] == "trace":
        return min(workload["num_requests"], 5)  # 6 rows, the zero-output one skipped
    return None
