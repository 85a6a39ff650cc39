"""Scheduler profiles: vLLM scheduler behaviour that changed between releases, as named data.

Like the stop profiles, a profile is chosen with one setting (`EngineConfig.scheduler_profile`, TOML
`[engine] scheduler_profile`, CLI `--scheduler-profile`). Each field names one behaviour and the release
that has it; every one is pinned by scenarios recorded from that release's own `Scheduler`
(tests/data/vllm_conformance/).

- "vllm-0.33" (the newest release; alias "vllm"): `long_prefill_token_threshold` applies only when more
  than one request is running or waiting (vllm/v1/core/sched/scheduler.py `schedule`); a running request
  that preempts itself under priority scheduling lets the requests after it go on scheduling; a priority
  victim that sat earlier in `running` moves the pass back one place, scheduled in this step or not;
  freed blocks that hold no cached prefix go to the front of the free queue, cached ones to the back
  (vllm/v1/core/block_pool.py `free_blocks`).
- "vllm-0.19" (the release of the real runs in ../shared/data/real_vllm_runs/): the threshold always
  applies; a priority self-preemption ends the step's running pass (the step schedules nothing and the
  next one goes on); a priority victim moves the pass back only if it was scheduled in this step, so one
  that sat earlier in `running` but was passed over (a request whose step in flight samples its last
  token under async scheduling, or a prefill whose chunk is all in flight under pipeline parallelism)
  makes the pass skip the request after the one that needed the block;
  every freed block goes to the back of the free queue.

Both releases turn async scheduling on by default (vllm/config/vllm.py), so the profiles do too.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels_cost_model.errors import ConfigError


@dataclass(frozen=True)
class SchedulerProfile:
    """How one vLLM release schedules.

    threshold_needs_company: `long_prefill_token_threshold` caps a chunk only when more than one request
        is running or waiting.
    self_preemption_continues: under priority scheduling, a request that preempts itself for a block
        lets the running requests after it still be scheduled in that step.
    skips_after_unscheduled_victim: a priority victim earlier in `running` that was not scheduled in this
        step shifts the list without moving the running pass back, so the request after the one that
        needed the block is skipped in that step (vLLM 0.19.1's index, fixed in 0.33).
    free_uncached_first: freed blocks without a cached prefix are reused first (front of the free queue).
    admission_lookahead: with speculative decoding, a request admitted with nothing computed gets its
        lookahead slots (num_lookahead_tokens) in the step that admits it, not only from its next step.
    eagle_drops_last_hit_block: with EAGLE-style drafts (eagle, eagle3, mtp), a prefix-cache hit gives
        up its last block, recomputed so the head has its last position's hidden state. On a hybrid
        model the full-attention groups drop theirs first, then a sliding-window group, searching below
        that, needs one more contiguous cached block than its window and drops it too (0.19.1
        vllm/v1/core/single_type_kv_cache_manager.py `SlidingWindowManager.find_longest_cache_hit`).
    eagle_hashes_next_token: with EAGLE-style drafts and prefix caching, each block's prefix-cache key
        also covers the token after the block, so a block is hit, and cached, only once that token is
        known (the head's KV at the block's last position depends on it); on a hybrid model in every
        group, and no group drops a block (0.33.0 vllm/v1/core/sched/scheduler.py `__init__` turns
        `use_eagle_block_drop` off when `num_hash_lookahead_tokens` is set).
    pads_new_decodes: with speculative decoding, a waiting request admitted with one token to compute
        (a one-token prompt, a prefix hit of all but its last token) is padded to 1 + k tokens, k
        placeholder drafts that verification rejects, so decode rows stay uniform, where no running
        prefill is scheduled in the step and a running row is or the request has tokens computed.
    caches_after_verify: with speculative decoding, a running request's blocks filled by its verified
        tokens enter the prefix cache as soon as those tokens are appended, not only when its next step
        allocates, so a request preempted before that step still hits them (0.33's update_from_output).
    windows_free_processed_only: in a hybrid model's sliding-window and chunked groups, a running
        request's allocation frees the blocks behind the window of its processed tokens only, not of
        the tokens still in flight under async scheduling (0.33.0 vllm/v1/core/kv_cache_manager.py
        `allocate_slots`: `remove_skipped_blocks(..., total_computed_tokens - num_in_flight_tokens)`;
        0.19.1 frees behind all computed tokens).
    window_admission_cap: in a hybrid model's sliding-window and chunked groups, the whole-sequence
        admission check (`scheduler_reserve_full_isl`) counts at most a window (or chunk) plus the
        tokens in flight, `max_num_batched_tokens` per concurrent step, not the whole sequence (0.33.0
        vllm/v1/core/single_type_kv_cache_manager.py `get_num_blocks_to_allocate`,
        `apply_admission_cap`, with vllm/v1/kv_cache_interface.py `max_admission_blocks_per_request`;
        0.19.1 `can_fit_full_sequence` counts every block).
    hybrid_kv_with_connectors: vLLM's hybrid KV cache manager stays on with servesim's KV connectors
        (NIXL between disaggregated pools, the OffloadingConnector of a CPU tier): 0.33.0
        vllm/config/vllm.py `VllmConfig.__post_init__` (lines 2257-2276) turns it off only for a
        connector without `SupportsHMA` (KVConnectorFactory.supports_hma_config), and both have it;
        0.19.1 (lines 1227-1241) turns it off for any `kv_transfer_config` (sim.core.hybrid_switch).
    mamba_align: with prefix caching on, a model with linear-attention (state) groups runs in vLLM's
        Mamba "align" cache mode: states cached at block boundaries and hit, prefill chunks ending there
        (0.33.0 vllm/model_executor/models/config.py `MambaModelConfig.verify_and_update_config`;
        sim.core.kv_mamba_align, policies.mamba_align). 0.19.1 picks "all" or "align" by model, not
        modelled: its state groups get no prefix hits.
    async_scheduling: the release's default for async scheduling.
    """

    name: str
    vllm_version: str
    threshold_needs_company: bool
    self_preemption_continues: bool
    skips_after_unscheduled_victim: bool
    free_uncached_first: bool
    admission_lookahead: bool
    eagle_drops_last_hit_block: bool
    eagle_hashes_next_token: bool
    pads_new_decodes: bool
    caches_after_verify: bool
    windows_free_processed_only: bool
    window_admission_cap: bool
    hybrid_kv_with_connectors: bool
    mamba_align: bool
    async_scheduling: bool = True

    @property
    def release(self) -> str:
        """The release as major.minor ("0.19")."""
        return major_minor(self.vllm_version)


def major_minor(version: str) -> str:
    """"0.19.1" -> "0.19"."""
    return ".".join(str(version).split(".")[:2])


def profile_for_version(version: str) -> str | None:
    """The name of the profile modelling vLLM `version` (matched on major.minor), or None."""
    return next((name for name, profile in PROFILES.items() if profile.release == major_minor(version)), None)


PROFILES: dict[str, SchedulerProfile] = {
    "vllm-0.33": SchedulerProfile("vllm-0.33", "0.33.0", threshold_needs_company=True,
                                  self_preemption_continues=True, skips_after_unscheduled_victim=False,
                                  free_uncached_first=True, admission_lookahead=True,
                                  eagle_drops_last_hit_block=False, eagle_hashes_next_token=True,
                                  pads_new_decodes=True, caches_after_verify=True,
                                  windows_free_processed_only=True, window_admission_cap=True,
                                  hybrid_kv_with_connectors=True, mamba_align=True),
    "vllm-0.19": SchedulerProfile("vllm-0.19", "0.19.1", threshold_needs_company=False,
                                  self_preemption_continues=False, skips_after_unscheduled_victim=True,
                                  free_uncached_first=False, admission_lookahead=False,
                                  eagle_drops_last_hit_block=True, eagle_hashes_next_token=False,
                                  pads_new_decodes=False, caches_after_verify=False,
                                  windows_free_processed_only=False, window_admission_cap=False,
                                  hybrid_kv_with_connectors=False, mamba_align=False),
}
ALIASES = {"vllm": "vllm-0.33"}


def get_scheduler_profile(name: str | SchedulerProfile) -> SchedulerProfile:
    """Look a profile up by name or alias (a SchedulerProfile passes through)."""
    if isinstance(name, SchedulerProfile):
        return name
    try:
        return PROFILES[ALIASES.get(name, name)]
    except (KeyError, TypeError):
        choices = sorted(PROFILES) + sorted(ALIASES)
        raise ConfigError("scheduler_profile", name, f"unknown; choose from {choices}") from None
