"""vLLM's Mamba prefix caching, "align" mode: a hybrid model's state groups cached at block boundaries.

vLLM 0.33 runs a model with linear-attention (Mamba, Gated DeltaNet) state in `mamba_cache_mode="align"`
whenever prefix caching is on (0.33.0 vllm/model_executor/models/config.py
`MambaModelConfig.verify_and_update_config`), the state's block size then being the attention block size.
The state group's block table is positional, as a full-attention one: entry i stands for the state after
(i + 1) x block_size tokens, and only the blocks a step's chunk ends in are real, the others vLLM's null
block (0.33.0 vllm/v1/core/single_type_kv_cache_manager.py `MambaManager`):
- an allocation takes at most one new state block, the one the chunk ends in (`get_num_blocks_to_allocate`,
  `allocate_new_blocks`: null blocks before it), and the whole-sequence admission check counts at most one;
- before it, the states wholly behind the processed tokens go back to the pool, last first
  (`remove_skipped_blocks`, `get_num_skipped_tokens` = processed - 1), so a request holds the running
  state and the one it is copied from (a third under async scheduling, until its step is processed);
- full blocks enter the prefix cache when allocated, in every group; a state block so cached holds the
  state at its block's end (the scheduler ends chunks there: `policies.mamba_align`);
- a hit (`find_longest_cache_hit`) is the rightmost cached state at or below the full-attention hit, its
  table null blocks and that state; a hit whose state was cached in the same step does not fit yet
  (`cached_blocks_this_step`); where the full-attention hit is longer, its end is the request's
  `shared_prefix_boundary` (0.33.0 vllm/v1/core/kv_cache_manager.py `get_computed_blocks`), a chunk end.

Only full-attention (or MLA) groups beside one-block state groups are modelled, without speculative decoding.
"""
from __future__ import annotations

import warnings

from kernels_cost_model.errors import ConfigError
from kernels_cost_model.kv_layout import MLA
from kernels_cost_model.model_shapes import FULL, LINEAR

from sim.core.kv_groups import HybridKVCacheManager
from sim.core.request import Request
from sim.core.scheduler_profiles import get_scheduler_profile


def aligns(groups) -> bool:
    """Whether the align manager models `groups`: full (or MLA) groups beside one-block state groups."""
    kinds = {g.kind for g in groups}
    return LINEAR in kinds and kinds <= {FULL, MLA, LINEAR} and all(
        g.state_blocks == 1 for g in groups if g.kind == LINEAR)


class MambaAlignKVCacheManager(HybridKVCacheManager):
    """The hybrid manager with state groups in vLLM's "align" mode (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.no_state_hits = False
        self.states = [g for g, group in enumerate(self.groups) if group.kind == LINEAR]
        #: tokens the scheduler ends prefill chunks on (`policies.mamba_align`)
        self.checkpoint_tokens = self.block_size
        self.junctions: dict[Request, int] = {}
        self.retired: dict[Request, int] = {}  # states before this index are gone (vLLM's retired blocks)
        self.cached_this_step: set = set()

    def add_speculative_state(self, num_speculative_tokens: int) -> None:
        """Align mode under speculative decoding is not modelled: before any request, this manager turns
        into the plain hybrid one (mode "none": no state hits, chunks not clipped), with a warning."""
        warnings.warn("vLLM 0.33 runs a model with linear-attention state in Mamba \"align\" mode with prefix "
                      "caching on; servesim does not model that mode under speculative decoding, so this run "
                      "uses mode \"none\" (no prefix hits on state, prefill chunks not cut at block "
                      "boundaries). Set enable_prefix_caching to false for vLLM's exact schedule.", stacklevel=2)
        self.__class__ = HybridKVCacheManager
        self.no_state_hits, self.checkpoint_tokens = True, 0
        self.add_speculative_state(num_speculative_tokens)

    def new_step_starts(self) -> None:
        self.cached_this_step.clear()

    def shared_prefix_boundary(self, req: Request) -> int:
        """Where the last lookup's full-attention hit outran the state hit (0: it did not)."""
        return self.junctions.get(req, 0)

    # ----- prefix cache ------------------------------------------------------------------------
    def lookup_prefix(self, req: Request):
        if not self.enable_prefix_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hashes = self._hashes(req, max_blocks)[:max_blocks]
        full = max_blocks
        for g, group in enumerate(self.groups):
            if group.kind != LINEAR:
                full = self._full_hit(g, hashes, full)
        cached = self.cached
        hit = next((i + 1 for i in range(full - 1, -1, -1) if all((g, hashes[i]) in cached for g in self.states)), 0)
        if full > hit:
            self.junctions[req] = full * self.block_size
        else:
            self.junctions.pop(req, None)
        if not hit:
            return [], 0
        tables = [[None] * (hit - 1) + [cached[(g, hashes[hit - 1])]] if g in self.states
                  else [cached[(g, h)] for h in hashes[:hit]] for g in range(len(self.groups))]
        return tables, hit * self.block_size

    def cache_full_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """As the hybrid manager's; the state blocks it caches are remembered for this step."""
        tables = self.req_tables.get(req)
        done = self.num_hashed_blocks.get(req, 0)
        unhashed = [b for g in self.states for b in tables[g][done:]
                    if b is not None and self.block_hash[b] is None] if tables else []
        super().cache_full_blocks(req, num_tokens)
        self.cached_this_step.update(self.block_hash[b] for b in unhashed if self.block_hash[b] is not None)

    def _hit_too_new(self, cached_blocks) -> bool:
        """A hit whose state was cached in this step: vLLM defers it to the next step."""
        return bool(cached_blocks) and any(cached_blocks[g] and self.block_hash[cached_blocks[g][-1]]
                                           in self.cached_this_step for g in self.states)

    # ----- allocation --------------------------------------------------------------------------
    def _first_state(self, req: Request) -> int:
        """Index of the first state block still needed: the one holding the last processed token's."""
        return max(0, self._processed(req) - 1) // self.block_size

    def _plan(self, req: Request, num_new_tokens: int, cached_blocks, caps=None) -> tuple[int, int, int]:
        tables = self.req_tables.get(req)
        hit_tokens = (len(cached_blocks[0]) * self.block_size) if cached_blocks else 0
        needed = -(-(req.num_computed_tokens + hit_tokens + num_new_tokens) // self.block_size)
        fresh = freed = 0
        for g, group in enumerate(self.groups):
            table = cached_blocks[g] if cached_blocks else (tables[g] if tables else [])
            if group.kind != LINEAR:
                fresh += max(0, needed - len(table))
                continue
            fresh += min(1, max(0, needed - len(table)))
            if tables and not cached_blocks:
                behind = table[self.retired.get(req, 0):self._first_state(req)]
                freed += sum(1 for b in behind if b is not None and self.ref_cnt[b] == 1)
        revived = 0
        if cached_blocks:
            live = {b for table in cached_blocks for b in table if b is not None}
            revived = sum(1 for b in live if self.ref_cnt[b] == 0)
        return fresh, revived, freed

    def can_fit(self, req: Request, num_new_tokens: int, cached_blocks=()) -> bool:
        return not self._hit_too_new(cached_blocks) and super().can_fit(req, num_new_tokens, cached_blocks)

    def allocate(self, req: Request, num_new_tokens: int, cached_blocks=()):
        tables = self.req_tables.get(req)
        if tables is not None and not cached_blocks:
            self._free_outside_windows(req, tables)
        if self._hit_too_new(cached_blocks):
            return None
        fresh, revived, _ = self._plan(req, num_new_tokens, cached_blocks)
        if fresh + revived > len(self.free_queue):
            return None
        tables, hit_tokens = self._take_hits(req, cached_blocks)
        total = req.num_computed_tokens + hit_tokens + num_new_tokens
        needed = -(-total // self.block_size)
        new_blocks: list[int] = []
        for group, table in zip(self.groups, tables):
            if len(table) >= needed:
                continue
            if group.kind == LINEAR:  # null blocks up to the one the chunk ends in
                table.extend([None] * (needed - 1 - len(table)))
            for _ in range(needed - len(table)):
                block = self._pop_free()
                table.append(block)
                new_blocks.append(block)
        self.req_blocks[req] = [b for table in tables for b in table if b is not None]
        if self.enable_prefix_caching:
            self.cache_full_blocks(req, min(total, req.num_tokens))
        return new_blocks

    def _free_outside_windows(self, req: Request, tables) -> None:
        """Free each state group's states behind the processed tokens, last first."""
        first, retired = self._first_state(req), self.retired.get(req, 0)
        if first <= retired:
            return
        for g in self.states:
            table = tables[g]
            removed = [table[i] for i in range(min(first, len(table)) - 1, retired - 1, -1) if table[i] is not None]
            table[retired:first] = [None] * len(table[retired:first])
            self._release(removed)
        self.retired[req] = first
        self.req_blocks[req] = [b for table in tables for b in table if b is not None]

    def free(self, req: Request, forget: bool = False) -> None:
        self.junctions.pop(req, None)
        self.retired.pop(req, None)
        super().free(req, forget)


def runs_mamba_align(config, groups) -> bool:
    """Whether an engine with `config` (resolved) runs a model of KV `groups` (several) in align mode: its
    scheduler profile's `mamba_align`, prefix caching on, groups `aligns` models."""
    return (bool(groups) and len(groups) > 1 and config.enable_prefix_caching
            and get_scheduler_profile(config.scheduler_profile).mamba_align and aligns(groups))


def mamba_align_manager(config, num_gpu_blocks: int, groups) -> MambaAlignKVCacheManager:
    """The align manager for an engine with `config` where it `runs_mamba_align`; vLLM requires chunked
    prefill there."""
    profile = get_scheduler_profile(config.scheduler_profile)
    if not config.enable_chunked_prefill:
        raise ConfigError("enable_chunked_prefill", False, "vLLM 0.33 runs a model with linear-attention state "
                          "with prefix caching in Mamba \"align\" mode, which needs chunked prefill (it refuses "
                          "to start): turn chunked prefill on or prefix caching off")
    return MambaAlignKVCacheManager(num_gpu_blocks, config.block_size, True, groups, profile.free_uncached_first,
                                    profile.windows_free_processed_only)
