"""EngineConfig: the engine knobs, with vLLM's names, validated at construction."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kernels_cost_model.errors import require
from sim.core.fields import MAX_TOKEN_ID, at_least, check_types, in_range, one_of
from sim.core.batch_defaults import (NO_DEVICE, NO_DEVICE_UNCHUNKED, PERFORMANCE_MODES, USAGE_CONTEXTS,
                                    with_batch_defaults)
from sim.core.scheduler_profiles import get_scheduler_profile

SCHEDULING_ORDERS = ("fcfs", "priority")
STOP_STRING_DETECTION = ("frontend", "engine")
ENGINE_MODES = ("fast", "step")
MAX_NUM_GPU_BLOCKS = 2**22
"""Largest KV cache the engine keeps books for: about 0.7 GiB of per-block state. Twice the largest
cache in the catalog (Qwen2.5-0.5B on 8 MI300X at block_size 16: 1.98M blocks)."""
MAX_BLOCK_SIZE = 2**16
"""Largest block the engine keeps (tokens): vLLM's run from 1 to 256, and to a few thousand where a
hybrid model's attention pages are aligned to its state pages; a block's tokens are hashed as one."""
DEFAULT_MAX_MODEL_LEN = 8192
"""max_model_len of an engine run with no model to take its maximum from (engine-level tests)."""
AUTO_MAX_MODEL_LEN = -1
"""max_model_len to fit to the KV cache (vLLM's -1 / "auto"): resolved by SimulationConfig."""


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler and KV-cache settings of one engine replica.

    num_gpu_blocks: KV-cache size in blocks of `block_size` tokens (None: sized from the model and
        GPU by the cost model's KV sizing; the engine itself needs a number).
    max_model_len: longest request, prompt plus output, in tokens (None: the model's own maximum, as
        vLLM; SimulationConfig resolves it, an engine run without a model uses DEFAULT_MAX_MODEL_LEN).
        AUTO_MAX_MODEL_LEN (-1 or "auto", vLLM's `--max-model-len auto`): the model's maximum, or the longest one
        request the sized KV cache holds where that is less (SimulationConfig).
    max_num_seqs: most requests running at once (None: vLLM's default for the GPU and `usage_context`,
        sim.core.batch_defaults; 256 for an engine run on its own, with no GPU).
    max_num_batched_tokens: token budget of one step, shared by prefill chunks and decodes (None: vLLM's
        default for the GPU and `usage_context`; for an engine run on its own 8192, or max(max_model_len,
        2048) without chunked prefill; never above max_num_seqs x max_model_len).
    usage_context: the entry point the requests come through, as vLLM's UsageContext:
        "openai_api_server" (`vllm serve`: its front end refuses a request whose prompt + max_tokens
        exceeds max_model_len), "llm_class" (`LLM(...)`, offline) or "engine_context" (an engine built
        directly: vLLM's scheduler class defaults); both cut such a request's output at max_model_len.
        It also picks the defaults of an unset budget and batch size. None: an engine run on its own
        (cuts, servesim's fixed defaults); simulate() takes "openai_api_server".
    performance_mode: vLLM's `--performance-mode`: "balanced" (the default), "throughput" (doubles the
        defaulted budget and batch size) or "interactivity" (CUDA graphs at every batch size up to 32).
    long_prefill_token_threshold: cap on one request's chunk per step (0: no cap).
    scheduler_reserve_full_isl: admit a waiting request only if KV blocks for its whole sequence
        are free, not just for its first chunk (vLLM's default; avoids over-admission and KV
        thrashing under chunked prefill).
    scheduling: "fcfs" or "priority" (lower `priority` value first; preempts the lowest).
    stop_profile: which stop-rule order to apply (see sim.core.stop_rules).
    scheduler_profile: which vLLM release's scheduler to follow (see sim.core.scheduler_profiles;
        "vllm" is the newest).
    async_scheduling: schedule step N+1 before step N's tokens are known, as vLLM's async scheduling
        does (None: the scheduler profile's default, on for every vLLM release modelled). A request
        that stops is then scheduled for one more decode, and freed KV and seats reach waiting
        requests one step later.
    stop_string_detection: where stop strings are found. "frontend": in the front end's detokenizer,
        as vLLM V1 does; the client sees the stop at once, but the engine learns of it only through
        an abort that lands during the next step, so the request is scheduled 1 (2 under async
        scheduling) more steps and keeps its KV until then. "engine": with the token checks, the
        request leaves at once (vLLM V0). None: "frontend" for the vllm policy under a V1 stop
        profile, else "engine". What the client sees (tokens, text, finish reason) is the same.
        Disaggregated instances and the last-token what-if find them in the engine whatever the
        setting (their hooks act on the step a request stops in); speculative decoding follows it.
    check_invariants: run `check_invariants` after every step (slow; for tests and debugging).
    record_token_times: keep every token's emission time (needed for ITL): true, false, or "runs" (the
        same times, kept as runs of step end times once a request finishes: a few integers per request,
        for very long runs; sim.core.token_runs).
    mode: "fast" leaps over quiet stretches of pure-decode steps in one pass (sim.engine.leap);
        "step" takes every step one by one (the reference). Both give bit-identical records.
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    scheduling: str = "fcfs"
    policy: str = "vllm"
    stop_profile: str = "vllm"
    scheduler_profile: str = "vllm"
    async_scheduling: bool | None = None
    stop_string_detection: str | None = None
    eos_token_id: int = 2
    check_invariants: bool = False
    record_token_times: bool | str = True
    mode: str = "fast"
    usage_context: str | None = None
    performance_mode: str = "balanced"

    @property
    def is_async(self) -> bool:
        """Whether steps are scheduled one ahead (the setting, else the scheduler profile's default)."""
        if self.async_scheduling is None:
            return get_scheduler_profile(self.scheduler_profile).async_scheduling
        return self.async_scheduling

    def resolved(self) -> "EngineConfig":
        """This config with a max_model_len (DEFAULT_MAX_MODEL_LEN when no model gave one) and, where
        unset, the step budget and batch size of an engine with no GPU to read (`NO_DEVICE`)."""
        config = self
        require(config.max_model_len != AUTO_MAX_MODEL_LEN, "max_model_len", AUTO_MAX_MODEL_LEN,
                "auto (fit to the KV cache) needs a model and a GPU to size the cache: run it through "
                "simulate() / servesim run, or give a number")
        if config.max_model_len is None:
            config = dataclasses.replace(config, max_model_len=DEFAULT_MAX_MODEL_LEN)
        if config.max_num_batched_tokens is None or config.max_num_seqs is None:
            budget, seqs = NO_DEVICE
            config = with_batch_defaults(config, budget if config.enable_chunked_prefill else NO_DEVICE_UNCHUNKED, seqs)
        return config

    @property
    def refuses_over_length(self) -> bool:
        """Whether the front end refuses a request whose prompt + max_tokens exceeds max_model_len
        (`vllm serve`'s OpenAI server does; the engine itself cuts the output there)."""
        return self.usage_context == "openai_api_server"

    @property
    def stop_strings_in_frontend(self) -> bool:
        """Whether stop strings end a request through the front end (the setting, else the default)."""
        if self.stop_string_detection is None:
            return self.policy == "vllm" and self.stop_profile != "vllm-v0"
        return self.stop_string_detection == "frontend"

    def __post_init__(self) -> None:
        if isinstance(self.max_model_len, str):  # vLLM's spelling "auto", as a TOML file may give it
            require(self.max_model_len.lower() == "auto", "max_model_len", self.max_model_len,
                    'must be an integer, "auto" (or -1: the longest the KV cache holds) or unset (the model\'s)')
            object.__setattr__(self, "max_model_len", AUTO_MAX_MODEL_LEN)
        check_types(self)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            at_least(name, getattr(self, name), 1, optional=True)
        if self.max_model_len != AUTO_MAX_MODEL_LEN:
            at_least("max_model_len", self.max_model_len, 1, optional=True)
        in_range("block_size", self.block_size, 1, MAX_BLOCK_SIZE, optional=True)
        in_range("num_gpu_blocks", self.num_gpu_blocks, 1, MAX_NUM_GPU_BLOCKS, optional=True,
                 why="KV bookkeeping is kept per block; use a larger block_size for a larger cache")
        if self.max_model_len != AUTO_MAX_MODEL_LEN:
            in_range("max_model_len", self.max_model_len, 1, MAX_TOKEN_ID, optional=True)
        at_least("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        one_of("scheduling", self.scheduling, SCHEDULING_ORDERS)
        if self.stop_string_detection is not None:
            one_of("stop_string_detection", self.stop_string_detection, STOP_STRING_DETECTION)
        one_of("mode", self.mode, ENGINE_MODES)
        if self.usage_context is not None:
            one_of("usage_context", self.usage_context, USAGE_CONTEXTS)
        one_of("performance_mode", self.performance_mode, PERFORMANCE_MODES)
        require(self.record_token_times is True or self.record_token_times is False
                or self.record_token_times == "runs", "record_token_times", self.record_token_times,
                'must be true, false or "runs"')
        in_range("eos_token_id", self.eos_token_id, 0, MAX_TOKEN_ID)
        get_scheduler_profile(self.scheduler_profile)
        require(self.async_scheduling in (None, True, False), "async_scheduling", self.async_scheduling,
                "must be true, false or unset")
        if self.max_model_len is None or self.max_model_len == AUTO_MAX_MODEL_LEN:
            return  # SimulationConfig (or run_engine) supplies it; the checks below need it
        require(self.enable_chunked_prefill or self.max_num_batched_tokens is None
                or self.max_num_batched_tokens >= self.max_model_len,
                "max_num_batched_tokens", self.max_num_batched_tokens,
                f"must be >= max_model_len={self.max_model_len} when enable_chunked_prefill is off"
                " (a prompt must fit one step whole)")
        if self.num_gpu_blocks is not None:
            capacity = self.num_gpu_blocks * self.block_size
            require(capacity >= self.max_model_len, "num_gpu_blocks", self.num_gpu_blocks,
                    f"KV cache holds {capacity} tokens ({self.num_gpu_blocks} blocks x {self.block_size}),"
                    f" less than one max_model_len={self.max_model_len} request;"
                    " pin more blocks or a smaller max_model_len")

