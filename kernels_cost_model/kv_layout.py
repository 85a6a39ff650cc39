"""KV-cache layout per attention type, the way vLLM's hybrid KV cache manager lays it out.

Every layer's cache is a tensor of `num_blocks` pages; a page holds `block_size` tokens of one layer
(bytes per token per layer below). vLLM groups layers of one kind into groups of `group_size` layers
(the fewest layers any kind has, or the most where that is under 1.5x the fewest, as when a drafter's
layer makes one kind a layer longer), so every group's block holds `group_size` pages and all groups
draw from ONE shared pool of `num_blocks` blocks: a pool block costs group_size x page bytes.
A drafter's attention layers (an EAGLE, EAGLE-3 or MTP head: one full-attention layer of the target's
shape) join the target's full-attention layers (KVCacheLayout.with_drafter_layers); under speculative
decoding a state group holds 1 + k states per request (KVCacheLayout.with_speculative_state).

bytes per token per layer on one GPU:
- full / sliding / chunked attention: 2 (K, V) x KV heads per GPU x head_dim x KV dtype bytes;
- MLA (DeepSeek-V3): kv_lora_rank + qk_rope_head_dim latent values, the same on every TP rank;
- linear attention (Gated DeltaNet): no per-token cache but a per-request state, conv state
  (2 x key + value widths x (kernel - 1)) plus recurrent state (value heads x key_dim x value_dim),
  split over TP; the conv state in the model dtype, the recurrent one too unless config.json's
  `mamba_ssm_dtype` says otherwise (vLLM's mamba_ssm_cache_dtype "auto" follows the model dtype; its
  Qwen3.5 config hook adopts `mamba_ssm_dtype`, float32 there); it takes ceil(state / page) pool blocks
  per request and group. A run raises the block size first, as vLLM does (`hybrid_block_size`: 16 ->
  544 tokens for Qwen3-Next at TP1), so a state takes one block; at 16 tokens a state would take ~34.
  The bytes are close either way, but the attention groups then allocate, hash and hit prefixes in
  blocks of the raised size.
`kv_cache_dtype="fp8"` stores attention KV in one byte (vLLM's --kv-cache-dtype fp8); states stay.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kernels_cost_model.errors import require

from .layer_partition import layer_partition
from .model_shapes import CHUNKED, FULL, LINEAR, SLIDING

KV_CACHE_DTYPES = ("auto", "fp8")
MLA = "mla"
#: The attention kernel's smallest block, which a raised hybrid block size is a multiple of:
#: FlashAttention / FlashInfer 16 tokens; MLA backends 64 in 0.19.1, 128 in 0.33.0 (no catalog model has
#: both MLA and linear-attention layers, so the MLA figures are not exercised).
KERNEL_BLOCK_ALIGNMENT = {"0.19": {False: 16, True: 64}, "0.33": {False: 16, True: 128}}


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """One group of layers sharing a block table. window: tokens a sliding (or chunk size of a chunked)
    layer attends to; state_blocks: pool blocks one request's state takes (linear attention only)."""

    kind: str
    num_layers: int
    window: int = 0
    state_blocks: int = 0


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    groups: tuple[KVCacheGroupSpec, ...]
    page_bytes: int         # one layer's page of block_size tokens
    group_size: int         # layers per group: a pool block is group_size pages
    block_size: int
    mamba_align: bool = False  # state groups in vLLM's "align" Mamba cache mode (prefix caching on)

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.group_size

    @property
    def is_hybrid(self) -> bool:
        """More than one group: the engine needs the hybrid manager (sim.core.kv_groups)."""
        return len(self.groups) > 1

    def all_full(self) -> "KVCacheLayout":
        """The layout with vLLM's hybrid KV cache manager off: every layer in one full-attention
        group, so sliding and chunked layers keep every block (vLLM's `unify_hybrid_kv_cache_specs`)
        and a pool block holds a page of every layer. A linear-attention state cannot be held so:
        vLLM refuses to start (0.19.1 "failed to convert", 0.33.0 "Failed to promote"), a named error."""
        if not self.is_hybrid:
            return self
        require(not any(g.kind == LINEAR for g in self.groups), "hybrid_kv_cache_manager", "off",
                "a model with linear-attention (state) layers needs vLLM's hybrid KV cache manager: vLLM "
                "refuses to start without it (its state cannot be held as full-attention KV)")
        layers = sum(g.num_layers for g in self.groups)
        return KVCacheLayout((KVCacheGroupSpec(FULL, layers),), self.page_bytes, layers, self.block_size)

    def with_drafter_layers(self, num_layers: int) -> "KVCacheLayout":
        """The layout with a drafter's `num_layers` attention layers of this page size added to the
        full-attention (or MLA) kind, regrouped as vLLM groups the target's and the drafter's layers
        together (`group_size_for`): gpt-oss-120b's 18 sliding + 18 full layers and an EAGLE-3 head
        make groups of 19 layers, the sliding group padded."""
        if not num_layers:
            return self
        counts: dict[tuple, int] = {}
        for g in self.groups:
            key = (g.kind, g.window, g.state_blocks)
            counts[key] = counts.get(key, 0) + g.num_layers
        full = next((key for key in counts if key[0] in (FULL, MLA)), (FULL, 0, 0))
        counts[full] = counts.get(full, 0) + num_layers
        group_size = group_size_for(counts.values())
        groups: list[KVCacheGroupSpec] = []
        for (kind, window, state), n in counts.items():
            while n > 0:
                groups.append(KVCacheGroupSpec(kind, min(group_size, n), window, state))
                n -= group_size
        return KVCacheLayout(tuple(groups), self.page_bytes, group_size, self.block_size)

    def with_speculative_state(self, num_speculative_tokens: int) -> "KVCacheLayout":
        """The layout under speculative decoding with k drafts a step: each state group holds 1 + k
        states per request (vLLM's `MambaSpec.num_speculative_blocks`, k under any method)."""
        if not num_speculative_tokens or not any(g.kind == LINEAR for g in self.groups):
            return self
        groups = tuple(replace(g, state_blocks=g.state_blocks * (1 + num_speculative_tokens))
                       if g.kind == LINEAR else g for g in self.groups)
        return KVCacheLayout(groups, self.page_bytes, self.group_size, self.block_size)

    def with_mamba_align(self) -> "KVCacheLayout":
        """The layout with its state groups in vLLM's "align" Mamba cache mode (0.33 with prefix caching
        on): vLLM budgets two states per request, the running one and the one it is copied from
        (0.33.0 vllm/v1/kv_cache_interface.py `MambaSpec.max_memory_usage_bytes`)."""
        return replace(self, mamba_align=True) if any(g.kind == LINEAR for g in self.groups) else self

    def blocks_per_request(self, num_tokens: int) -> int:
        """Pool blocks one request of `num_tokens` tokens holds while decoding (windows already freed)."""
        bs, total = self.block_size, 0
        for g in self.groups:
            if g.kind == LINEAR:
                total += g.state_blocks
            elif g.kind == SLIDING:
                total += min(-(-num_tokens // bs), -(-(g.window - 1) // bs) + 1)
            elif g.kind == CHUNKED:
                total += min(-(-num_tokens // bs), -(-g.window // bs) + 1)
            else:
                total += -(-num_tokens // bs)
        return total

    def transfer_blocks(self, num_tokens: int, num_cached_tokens: int = 0) -> tuple[int, ...]:
        """Blocks per group vLLM 0.33's NIXL connector moves for a prompt of `num_tokens` tokens whose
        first `num_cached_tokens` (whole blocks) the receiver holds: a full or chunked group its missing
        blocks, a sliding group at most its window's cdiv(window, block_size) + 1 of them, a state group
        its one running state (nixl/base_scheduler.py `get_exchange_clipped_blocks`; the receiver's
        uncached tail, nixl/base_worker.py `_apply_prefix_caching`); nothing on a full hit."""
        bs = self.block_size
        missing = -(-num_tokens // bs) - num_cached_tokens // bs
        if missing <= 0:
            return (0,) * len(self.groups)
        return tuple(1 if g.kind == LINEAR else min(missing, -(-g.window // bs) + 1) if g.kind == SLIDING
                     else missing for g in self.groups)

    def max_concurrency(self, num_blocks: int, num_tokens: int) -> int:
        """Requests of `num_tokens` tokens that fit in the pool at once."""
        return num_blocks // self.blocks_per_request(num_tokens)

    def tokens(self, num_blocks: int) -> int:
        """KV tokens vLLM reports ("GPU KV cache size: N tokens"): blocks per group x block_size."""
        return num_blocks // len(self.groups) * self.block_size

    def admission_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Pool blocks vLLM budgets for one request of `max_model_len` tokens when it checks that one
        fits and reports its concurrency (each group's `max_memory_usage_bytes`, summed): a sliding
        group keeps its window plus `max_num_batched_tokens` (+1 block for a window straddling a block
        boundary), a chunked one a chunk plus those tokens, a state group its state. vLLM 0.33 passes
        its tokens in flight here (two steps' under async scheduling), 0.19 one step's
        (sim.core.kv_groups.window_budget_tokens). In "align" mode a state group its two states."""
        bs, total = self.block_size, 0
        for g in self.groups:
            if g.kind == LINEAR:
                total += g.state_blocks * (2 if self.mamba_align else 1)
            elif g.kind == SLIDING:
                total += -(-min(g.window - 1 + max_num_batched_tokens, max_model_len) // bs) + 1
            elif g.kind == CHUNKED:
                total += -(-min(g.window + max_num_batched_tokens, max_model_len) // bs)
            else:
                total += -(-max_model_len // bs)
        return total

    def vllm_max_concurrency(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request: Nx"; below 1 vLLM
        refuses to start."""
        return num_blocks / self.admission_blocks(max_model_len, max_num_batched_tokens)


def kv_dtype_bytes(spec, kv_cache_dtype: str) -> int:
    require(kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", kv_cache_dtype,
            f"must be one of {', '.join(KV_CACHE_DTYPES)}")
    return 1 if kv_cache_dtype == "fp8" else spec.dtype_bytes


def attention_bytes_per_token_layer(spec, kv_heads_per_gpu: int, kv_cache_dtype: str = "auto") -> int:
    """KV bytes one token takes in one attention layer on one GPU."""
    b = kv_dtype_bytes(spec, kv_cache_dtype)
    if spec.is_mla:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * b
    return 2 * kv_heads_per_gpu * spec.head_dim * b


def linear_state_bytes(spec, tp: int) -> int:
    """One request's state in one linear-attention layer on one GPU (conv + recurrent states)."""
    key = spec.linear_num_key_heads * spec.linear_key_head_dim
    value = spec.linear_num_value_heads * spec.linear_value_head_dim
    conv = (2 * key + value) // tp * (spec.linear_conv_kernel_dim - 1)
    recurrent = spec.linear_num_value_heads // tp * spec.linear_key_head_dim * spec.linear_value_head_dim
    return conv * spec.dtype_bytes + recurrent * (spec.ssm_state_dtype_bytes or spec.dtype_bytes)


def group_size_for(layer_counts) -> int:
    """Layers per group, as vLLM picks it from the layer count of each kind: the fewest, unless the
    most are under 1.5x the fewest (a drafter's layer added to one kind), then the most, the shorter
    kinds' groups padded (vLLM's `_get_kv_cache_groups_uniform_page_size`)."""
    counts = list(layer_counts)
    fewest, most = min(counts), max(counts)
    return most if most < 1.5 * fewest else fewest


def _layer_kinds(spec) -> list[str]:
    """Each layer's kind, in layer order (full attention as MLA for an MLA model)."""
    kinds = spec.layer_types or (FULL,) * spec.num_layers
    return [MLA if (spec.is_mla and k == FULL) else k for k in kinds]


def _kind_counts(spec) -> dict[str, int]:
    counts: dict[str, int] = {}
    for k in _layer_kinds(spec):
        counts[k] = counts.get(k, 0) + 1
    return counts


def stage_group_sizes(spec, layout: KVCacheLayout, partition) -> tuple[int, ...]:
    """Layers per pool block on each pipeline stage; `partition`: the layers of each stage, in order (an
    int PP: vLLM's default partition, layer_partition.py). vLLM groups the whole model's layers and
    deals each kind's layers to its groups in turn (group i of n takes layers[i::n], so every stage gets
    its share of each group: 0.19.1 kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`, 0.33.0
    kv_cache_planning.py), keeps on each stage the layers it holds (`_project_kv_cache_groups_to_worker`),
    and gives a stage's pool block as many pages as its fullest group has layers there (0.19.1
    `get_kv_cache_config_from_groups`, 0.33.0 `_get_kv_cache_bytes_per_block`). With one stage:
    `layout.group_size`."""
    kinds = _layer_kinds(spec) if layout.is_hybrid else [FULL] * spec.num_layers
    if isinstance(partition, int):
        partition = layer_partition(len(kinds), partition)
    groups: list[list[int]] = []
    for kind in dict.fromkeys(kinds):
        layers = [i for i, k in enumerate(kinds) if k == kind]
        n = -(-len(layers) // layout.group_size)
        groups += [layers[i::n] for i in range(n)]
    bounds = [sum(partition[:stage]) for stage in range(len(partition) + 1)]
    return tuple(max(sum(bounds[stage] <= i < bounds[stage + 1] for i in g) for g in groups)
                 for stage in range(len(partition)))


def kv_cache_layout(spec, kv_heads_per_gpu: int, tp: int, block_size: int,
                    kv_cache_dtype: str = "auto") -> KVCacheLayout:
    """The groups and pool block size of `spec` on one GPU."""
    page = block_size * attention_bytes_per_token_layer(spec, kv_heads_per_gpu, kv_cache_dtype)
    counts = _kind_counts(spec)
    group_size = group_size_for(counts.values())
    groups: list[KVCacheGroupSpec] = []
    for kind in (MLA, FULL, SLIDING, CHUNKED, LINEAR):
        n = counts.pop(kind, 0)
        window = spec.sliding_window if kind in (SLIDING, CHUNKED) else 0
        state = -(-linear_state_bytes(spec, tp) // page) if kind == LINEAR else 0
        while n > 0:
            groups.append(KVCacheGroupSpec(kind, min(group_size, n), window, state))
            n -= group_size
    require(not counts, "model", spec.name, f"has layer types servesim does not model: {sorted(counts)}")
    return KVCacheLayout(tuple(groups), page, group_size, block_size)


def hybrid_block_size(spec, kv_heads_per_gpu: int, tp: int, block_size: int, kv_cache_dtype: str = "auto",
                      release: str = "0.33") -> int:
    """The attention block size vLLM runs a model with linear-attention (state) layers at: the smallest
    multiple of the kernel's alignment whose attention page holds one layer's state, if `block_size` is
    smaller (it overrides even a size the user set, and logs it); else `block_size`, the state page
    padded up to the attention page. 0.19.1 aligns to the kernel's block (16 tokens, MLA 64);
    0.33.0 to the larger of that and the block size asked for, then to a multiple of the kernel's
    block (so `block_size=64` gives 576 for Qwen3-Next, not 544). In "align" mode 0.33 also aligns to
    the layers' prefill checkpoints, which only a FlashInfer GDN prefill declares: not modelled (the
    Triton prefill's layers declare none, so the size is the same). A model without state keeps `block_size`."""
    if LINEAR not in (spec.layer_types or ()):
        return block_size
    require(release in KERNEL_BLOCK_ALIGNMENT, "release", release,
            f"must be one of {', '.join(KERNEL_BLOCK_ALIGNMENT)}")
    per_token = attention_bytes_per_token_layer(spec, kv_heads_per_gpu, kv_cache_dtype)
    state = linear_state_bytes(spec, tp)
    kernel = KERNEL_BLOCK_ALIGNMENT[release][bool(spec.is_mla)]
    align = kernel if release == "0.19" else max(kernel, block_size)
    need = align * -(-state // (align * per_token))
    need = kernel * -(-need // kernel)
    return max(block_size, need)
