"""Whether vLLM runs its hybrid KV cache manager for a run, and the KV layout the run then has.

vLLM decides once, at start-up (vllm/config/vllm.py `VllmConfig.__post_init__`: 0.19.1 lines
1190-1258, 0.33.0 lines 2223-2290). For servesim's runs it turns the manager off when:
- a KV connector is configured that the release does not run with the manager: 0.19 any connector,
  0.33 only one without hybrid support; servesim's connectors (`NIXL` for disaggregated pools,
  `OFFLOADING` for a CPU tier) have it in 0.33 (the profile's `hybrid_kv_with_connectors`);
- the model has chunked local attention (Llama-4) and the drafts are EAGLE-style ("eagle", "eagle3",
  "mtp"; speculative_config.use_eagle), in both releases.
Off, every layer joins one full-attention group (KVCacheLayout.all_full): sliding and chunked layers
keep every block, a pool block holds a page of every layer. A model with linear-attention state
cannot be held so: vLLM refuses to start, and so does servesim, with a ConfigError naming the
setting that turned the manager off.
"""
from __future__ import annotations

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.model_shapes import CHUNKED, LINEAR

from sim.core.scheduler_profiles import get_scheduler_profile
from sim.core.speculative import EAGLE_METHODS

#: servesim's KV connectors, by vLLM's names: between disaggregated pools, and a CPU tier's
NIXL = "NixlConnector"
OFFLOADING = "OffloadingConnector"


def hybrid_off_reason(layout, profile, connectors=(), speculative_method=None) -> tuple[str, object, str] | None:
    """(field, value, why) of the setting that turns vLLM's hybrid manager off for a run of a model
    with `layout` under scheduler `profile`, with the KV `connectors` (NIXL, OFFLOADING) the topology
    adds and the speculative method, or None where it stays on (or the model has one layer group)."""
    if layout is None or not layout.is_hybrid:
        return None
    profile = get_scheduler_profile(profile)
    if any(g.kind == CHUNKED for g in layout.groups) and speculative_method in EAGLE_METHODS:
        return ("speculative_config.method", speculative_method,
                "vLLM turns its hybrid KV cache manager off for chunked local attention with EAGLE-style drafts")
    if connectors and not profile.hybrid_kv_with_connectors:
        return ("engine.scheduler_profile", profile.name, f"vLLM {profile.release} turns its hybrid KV cache "
                f"manager off for any KV connector (here {' and '.join(connectors)})")
    return None


def run_layout(layout, profile, connectors=(), speculative_method=None):
    """The KV layout vLLM runs `layout` with: `layout` itself, or every layer as full attention
    where the hybrid manager is off (a ConfigError where vLLM would refuse to start)."""
    reason = hybrid_off_reason(layout, profile, connectors, speculative_method)
    if reason is None:
        return layout
    field, value, why = reason
    if any(g.kind == LINEAR for g in layout.groups):
        raise ConfigError(field, value, f"{why}, and a model with linear-attention state needs it: vLLM "
                          "refuses to start (its state cannot be held as full-attention KV)")
    return layout.all_full()

