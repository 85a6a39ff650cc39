"""Which KV cache manager an engine runs: the plain one, the hybrid one per layer group
(sim.core.kv_groups), or the hybrid one with state groups in vLLM's Mamba "align" mode
(sim.core.kv_mamba_align), with the scheduler profile's KV behaviours."""
from __future__ import annotations

from sim.core.kv_cache import KVCacheManager
from sim.core.kv_groups import admission_caps, make_kv_manager, window_budget_tokens
from sim.core.kv_mamba_align import mamba_align_manager, runs_mamba_align
from sim.core.scheduler_profiles import get_scheduler_profile


def kv_manager_for(config, num_gpu_blocks: int, groups=None) -> KVCacheManager:
    """The KV manager of an engine with `config` (resolved) and the model's KV `groups`, with its
    scheduler profile's KV behaviours."""
    if runs_mamba_align(config, groups):
        return mamba_align_manager(config, num_gpu_blocks, groups)
    profile = get_scheduler_profile(config.scheduler_profile)
    caps = None
    if groups and len(groups) > 1 and profile.window_admission_cap:
        caps = admission_caps(groups, config.block_size, config.max_model_len, window_budget_tokens(config))
    return make_kv_manager(num_gpu_blocks, config.block_size, config.enable_prefix_caching, groups,
                           profile.free_uncached_first, frees_processed_only=profile.windows_free_processed_only,
                           admission_caps=caps)
