"""Conformance scenarios: one engine configuration and a list of scripted requests, as plain JSON data.

A scenario is what both vLLM's real scheduler and servesim's `Engine` are driven through. Time is in
steps: every step that schedules tokens lasts `STEP_S` (1 s), so "arrives during step 3" means an arrival
time in (2, 3). Arrival and abort times carry distinct fractions of 1/64 so no event ever ties with a step
boundary (an idle engine restarts at an arrival, and later boundaries keep that arrival's fraction).

    {"config": {"block_size": 16, "num_gpu_blocks": 12, "max_model_len": 128, "max_num_seqs": 4,
                "max_num_batched_tokens": 64, "enable_chunked_prefill": true,
                "long_prefill_token_threshold": 0, "enable_prefix_caching": true,
                "scheduling": "fcfs", "async_scheduling": true},
     "requests": [{"id": "r0", "arrival": 0.015625, "prompt": [...], "output": [...],
                   "max_tokens": 8, "ignore_eos": false, "stop_token_ids": [7], "priority": 0,
                   "abort": null}]}

`output` is the token stream the model "samples" (EOS is `EOS_TOKEN_ID`); the request stops as its
sampling params say. `random_scenario(seed)` draws one from a seeded generator.

Speculative-decoding scenarios (`random_spec_scenario`) add `"speculative": {"method": "eagle",
"num_speculative_tokens": k, "acceptance_rates": [...], "seed": s}`: both sides accept drafts as
`PositionalAcceptance(rates, seed)` decides for (request's index in arrival order, output position).

Hybrid-model scenarios (`random_hybrid_scenario`) add `"kv_groups"` to the config: `[{"kind": "full"},
{"kind": "sliding", "window": 12}]` ("sliding", "chunked", "linear"; window in tokens), and
`num_gpu_blocks` counts the one block pool they share.

Stop-rule scenarios (`random_stop_scenario`) add, per request, `"min_tokens"`, `"stop"` (stop strings,
over the text of `token_text`), and `"max_tokens": null` (up to `max_model_len`). `random_spec_scenario(seed,
stop_rules=True)` draws those requests under speculative decoding, so a stop string often completes inside a
step that verifies several tokens.

Hybrid spec-decoding scenarios (`random_hybrid_spec_scenario`) carry both `"kv_groups"` and `"speculative"`.

Mamba-align scenarios (`random_hybrid_align_scenario`) are state-model scenarios with prefix caching on:
their config adds `"mamba_cache_mode": "align"` (vLLM's mode for a hybrid model with prefix caching).
"""
from __future__ import annotations

import numpy as np

from workloads.acceptance import PositionalAcceptance
from workloads.rng import make_rng

EOS_TOKEN_ID = 2
STEP_S = 1.0
STOP_TOKEN_ID = 7
_FRACTIONS = [(2 * k + 1) / 64 for k in range(32)]  # exact in binary; distinct per event
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
STOP_STRINGS = [["cd"], ["f", "ab"], ["ij"], ["b"], ["hij", "dd"]]


def token_text(token_id: int) -> str:
    """The text of a token in conformance scenarios: ids 3..28 are the letters a..z, except the stop
    token id (no text, like EOS and every other id: what a masked or filler token reads makes no
    difference)."""
    if 3 <= token_id < 3 + len(_LETTERS) and token_id != STOP_TOKEN_ID:
        return _LETTERS[token_id - 3]
    return ""


def random_config(rng: np.random.Generator) -> dict:
    """Budgets, thresholds, block sizes and KV sizes, from minimal to roomy."""
    block_size = int(rng.choice([4, 8, 16]))
    max_model_len = int(rng.choice([64, 128, 256]))
    min_blocks = -(-max_model_len // block_size) + 1  # + vLLM's null block
    chunked = bool(rng.random() < 0.75)
    budget = int(rng.integers(8, 300)) if chunked else int(rng.integers(max_model_len, max_model_len + 200))
    return {
        "block_size": block_size,
        "num_gpu_blocks": int(rng.integers(min_blocks, 3 * min_blocks)),
        "max_model_len": max_model_len,
        "max_num_seqs": int(rng.integers(1, 9)),
        "max_num_batched_tokens": budget,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": int(rng.choice([0, 0, 8, 32])),
        "enable_prefix_caching": bool(rng.random() < 0.6),
        "scheduling": str(rng.choice(["fcfs", "priority"])),
        "async_scheduling": bool(rng.random() < 0.5),
    }


def random_request(rng: np.random.Generator, index: int, arrival: float, config: dict,
                   prefixes: list[list[int]]) -> dict:
    """One request: a prompt (often sharing a prefix), a scripted stream and its stop knobs."""
    max_model_len = config["max_model_len"]
    prefix = prefixes[int(rng.integers(len(prefixes)))] if rng.random() < 0.5 else []
    own = [int(t) for t in rng.integers(3, 40, size=int(rng.integers(1, max(2, max_model_len // 2))))]
    prompt = (prefix + own)[:max_model_len - 1 if rng.random() < 0.97 else max_model_len]
    max_tokens = int(rng.integers(1, 40))
    stream = [int(t) for t in rng.integers(3, 40, size=max_tokens + 2)]
    if rng.random() < 0.5:
        stream[int(rng.integers(len(stream)))] = EOS_TOKEN_ID
    abort = None
    if rng.random() < 0.15:
        abort = float(int(arrival) + int(rng.integers(0, 12)) + _FRACTIONS[16 + index])
    return {
        "id": f"r{index}",
        "arrival": arrival,
        "prompt": prompt,
        "output": stream,
        "max_tokens": max_tokens,
        "ignore_eos": bool(rng.random() < 0.3),
        "stop_token_ids": [STOP_TOKEN_ID] if rng.random() < 0.3 else [],
        "priority": int(rng.integers(0, 4)),
        "abort": abort if abort is not None and abort > arrival else None,
    }


def random_stop_request(rng: np.random.Generator, index: int, arrival: float, config: dict,
                        prefixes: list[list[int]]) -> dict:
    """A request exercising the stop rules: min_tokens, max_tokens unset, stop strings, stop token
    ids and EOS in a stream over a few letters (so the strings complete often)."""
    req = random_request(rng, index, arrival, config, prefixes)
    room = config["max_model_len"] - len(req["prompt"])
    max_tokens = None if rng.random() < 0.3 else int(rng.integers(1, 40))
    limit = max(0, min(room, max_tokens or room))
    min_tokens = 0 if rng.random() < 0.5 else int(rng.integers(0, min(6, limit) + 1))
    length = min(room, max_tokens or room) + 2
    stream = [int(t) for t in rng.integers(3, 13, size=length)]
    for _ in range(int(rng.integers(0, 3))):
        stream[int(rng.integers(len(stream)))] = EOS_TOKEN_ID
    stop = STOP_STRINGS[int(rng.integers(len(STOP_STRINGS)))] if rng.random() < 0.7 else []
    return dict(req, output=stream, max_tokens=max_tokens, min_tokens=min_tokens, stop=list(stop))


def random_scenario(seed: int, stop_rules: bool = False) -> dict:
    """A seeded random scenario (same seed, same scenario); `stop_rules`: its requests come from
    `random_stop_request`."""
    rng = make_rng(seed, "vllm-conformance-stop" if stop_rules else "vllm-conformance")
    return _draw_scenario(rng, random_stop_request if stop_rules else random_request)


def random_spec_scenario(seed: int, stop_rules: bool = False) -> dict:
    """A seeded random scenario with EAGLE-style speculative decoding: k drafts (1..4), per-position
    acceptance rates and a seed for `workloads.acceptance.PositionalAcceptance`; the KV cache is
    often only a few blocks above one max_model_len sequence, so the lookahead slots matter.
    `stop_rules`: its requests come from `random_stop_request` (stop strings, min_tokens), from a
    seed stream of their own."""
    rng = make_rng(seed, "vllm-conformance-spec-stop" if stop_rules else "vllm-conformance-spec")
    scenario = _draw_scenario(rng, random_stop_request if stop_rules else random_request)
    k = int(rng.integers(1, 5))
    scenario["speculative"] = {"method": "eagle", "num_speculative_tokens": k,
                               "acceptance_rates": [round(float(r), 2) for r in rng.uniform(0.2, 1.0, size=k)],
                               "seed": int(rng.integers(0, 1 << 16))}
    config = scenario["config"]
    if rng.random() < 0.5:
        min_blocks = -(-config["max_model_len"] // config["block_size"]) + 1
        config["num_gpu_blocks"] = min_blocks + int(rng.integers(0, 4))
    return scenario


#: hybrid layouts: the KV groups of a model kind, each with a window (tokens) drawn per scenario
HYBRID_LAYOUTS = {
    "sliding": ("full", "sliding"),             # gpt-oss
    "gemma": ("full", "sliding", "sliding"),    # Gemma-3: several sliding groups of one window
    "chunked": ("full", "chunked"),             # Llama-4
    "linear": ("full", "linear"),               # Qwen3-Next (a Mamba state, prefix caching off)
}


def random_hybrid_scenario(seed: int) -> dict:
    """A seeded random scenario for a hybrid model: its config carries `"kv_groups"`, a full-attention
    group and sliding-window, chunked local or linear-attention (state) groups with small windows (a few
    blocks) so windows free blocks and prefix hits cross them within short prompts. `num_gpu_blocks`
    counts the one pool all groups share: from one max_model_len request in every group (plus the null
    block) to three times that, often tight. A state group's model runs without prefix caching (with it,
    vLLM's Mamba "align" mode: `random_hybrid_align_scenario`)."""
    rng = make_rng(seed, "vllm-conformance-hybrid")
    scenario = _draw_scenario(rng, random_request)
    groups = _draw_kv_groups(rng, scenario["config"], sorted(HYBRID_LAYOUTS))
    _draw_pool(rng, scenario["config"], groups)
    return scenario


#: the hybrid layouts vLLM runs with its hybrid KV manager under EAGLE-style drafts: it turns the manager
#: off for chunked local attention with EAGLE (vllm/config/vllm.py), so that layout is left out
HYBRID_SPEC_LAYOUTS = ("gemma", "linear", "sliding")


def random_hybrid_spec_scenario(seed: int) -> dict:
    """A seeded random scenario of speculative decoding on a hybrid model: a `random_hybrid_scenario`
    layout (sliding window or state groups; not chunked local attention, see `HYBRID_SPEC_LAYOUTS`) and
    a `random_spec_scenario` EAGLE config. The pool is one max_model_len request in every group (a state
    group's k speculative state blocks too) plus the null block, and a few blocks more half the time, so
    lookahead slots and windows decide preemptions; requests often share prefixes (hits)."""
    rng = make_rng(seed, "vllm-conformance-hybrid-spec")
    scenario = _draw_scenario(rng, random_request)
    config = scenario["config"]
    groups = _draw_kv_groups(rng, config, HYBRID_SPEC_LAYOUTS)
    k = int(rng.integers(1, 5))
    scenario["speculative"] = {"method": "eagle", "num_speculative_tokens": k,
                               "acceptance_rates": [round(float(r), 2) for r in rng.uniform(0.2, 1.0, size=k)],
                               "seed": int(rng.integers(0, 1 << 16))}
    _draw_pool(rng, config, groups, state_blocks=1 + k)
    return scenario


def random_hybrid_align_scenario(seed: int) -> dict:
    """A seeded random scenario of a state model (full attention beside a linear-attention group) with
    prefix caching and chunked prefill on, in vLLM's "align" Mamba cache mode: requests often share
    prefixes (hits on checkpointed states); the pool is one max_model_len request in the full group,
    two state blocks and the null block, and a few blocks more half the time."""
    rng = make_rng(seed, "vllm-conformance-hybrid-align")
    scenario = _draw_scenario(rng, random_request)
    config = scenario["config"]
    config.update(enable_prefix_caching=True, enable_chunked_prefill=True, mamba_cache_mode="align",
                  max_num_batched_tokens=int(rng.integers(8, 300)))
    groups = [{"kind": "full", "window": 0}, {"kind": "linear", "window": 0}]
    config["kv_groups"] = groups
    _draw_pool(rng, config, groups, state_blocks=2)
    return scenario


def _draw_kv_groups(rng: np.random.Generator, config: dict, layouts) -> list[dict]:
    """A layout of `layouts` with a small window (a few blocks), set as `config["kv_groups"]` (prefix
    caching off with a state group)."""
    block = config["block_size"]
    layout = str(rng.choice(layouts))
    if rng.random() < 0.75:
        window = block * int(rng.integers(1, 5)) + int(rng.choice([0, 0, 1, -1]))
    else:
        window = int(rng.integers(2, 4 * block + 1))
    groups = [{"kind": kind, "window": window if kind in ("sliding", "chunked") else 0}
              for kind in HYBRID_LAYOUTS[layout]]
    config["kv_groups"] = groups
    if layout == "linear":
        config["enable_prefix_caching"] = False
    return groups


def _draw_pool(rng: np.random.Generator, config: dict, groups: list[dict], state_blocks: int = 1) -> None:
    """`num_gpu_blocks`: one max_model_len request in every group (`state_blocks` in a state group) and
    the null block, plus up to 3 blocks half the time, else up to three times that."""
    per_group = -(-config["max_model_len"] // config["block_size"])
    need = sum(state_blocks if g["kind"] == "linear" else per_group for g in groups) + 1
    if rng.random() < 0.5:
        config["num_gpu_blocks"] = need + int(rng.integers(0, 4))
    else:
        config["num_gpu_blocks"] = int(rng.integers(need, 3 * need))


def _draw_scenario(rng: np.random.Generator, draw_request) -> dict:
    """A config and one to eight requests from `rng`."""
    config = random_config(rng)
    block = config["block_size"]
    prefixes = [[int(t) for t in rng.integers(3, 40, size=block * int(rng.integers(1, 4)))]
                for _ in range(2)]
    requests, t = [], 0
    for i in range(int(rng.integers(1, 9))):
        t += int(rng.choice([0, 0, 1, 2, 5]))
        requests.append(draw_request(rng, i, t + _FRACTIONS[i], config, prefixes))
    return {"config": config, "requests": requests}


def make_scenario_acceptance(speculative: dict | None):
    """The acceptance model both sides use for a spec-decoding scenario (None without one)."""
    if speculative is None:
        return None
    return PositionalAcceptance(tuple(speculative["acceptance_rates"]), speculative["seed"])


def without_request(scenario: dict, request_id: str) -> dict:
    """The scenario less one request (for shrinking a disagreement)."""
    return dict(scenario, requests=[r for r in scenario["requests"] if r["id"] != request_id])
