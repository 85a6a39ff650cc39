"""What speculative decoding costs: the target's verification step, the rejection sampler, the
proposer's time per step, and memory for the proposer's weights and KV.

Verification (`verify_step_time`): a running request's row of 1 + k query tokens (its last token
and k drafts) is a decode-like row, not a prefill chunk: vLLM runs it through the decode attention
path (uniform `1 + k`-query batches, CUDA graphs), reading the request's KV once for all its
queries, which share the kernel's query tile as a GQA group's heads do in plain decode. So the
step is priced as the same batch with every verification row turned into one decode row over all
its keys (context + k + 1) for attention, while the matmuls, norms, LM head (logits for every
verified position) and collectives see every query token. A row that still carries prompt tokens
besides its drafts (a prefill chunk ending in drafts) stays a prefill chunk.

The proposer runs after the target in the same step (vLLM V1 drafts in the model runner, right
after sampling):

- "eagle", "eagle3", "mtp": a one-layer head (shapes below). Its first pass reads the
  target's hidden states for every scheduled token (same rows as the target batch); then k - 1
  passes of one token per proposing request. Plus `draft_overhead_s` per step. A draft tree
  (`tree_widths`: nodes per depth) replaces those passes by one per depth but the last, each
  over the previous depth's nodes of every proposing request (decode-like rows, as above).
- "draft_model": the same passes through the draft model's own cost model.
- "ngram": prompt lookup on the CPU, `ngram_fraction_of_step` of the target step.

The heads' own shapes (`DraftShape`, `head_cost_model`), as vLLM's llama_eagle.py and
llama_eagle3.py build them for Llama targets:
- EAGLE-1: every pass first folds [token embedding ; hidden state] (2 x hidden) into hidden
  with an fc, then runs the target-shaped layer; logits through the target's own LM head.
- EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one layer, hidden 4096, 32 query / 8 KV heads,
  intermediate 14336, vocab_size 128256, draft_vocab_size 32000; the config.json of SGLang's copy,
  huggingface.co/jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B, and SpecForge's
  configs/llama3-8B-eagle3.json): the first pass folds three target layers' hidden states
  (3 x hidden -> hidden, fc) for every scheduled token; the layer's qkv_proj reads [normed
  embedding ; normed hidden] (2 x hidden wide); its own LM head covers draft_vocab_size tokens,
  and every pass then expands each sampled row's logits into the target's vocabulary
  (`logits.new_full((rows, vocab_size), -inf)`, a scatter through the draft-to-target table, an
  argmax over the target vocabulary: eager kernels outside the CUDA graph).

The rejection sampler (`RejectionSampler`) runs on the target's logits of every verified
position before the drafter (vLLM's rejection_sampler.py): greedy takes an argmax; random
sampling scales by temperature, takes a softmax and samples recovered tokens; top-p / top-k adds
`apply_top_k_top_p`, a full-vocabulary sort of every verified position's logits (with int64
indices), a softmax and cumsum over the sorted rows and a scatter back. Priced as the bytes these
passes move per logit (fp32) at the GPU's elementwise rates: each launch's share at its L2 tier
while it fits there, at the DRAM tier's beyond (l2_cache.ElementwiseOp.launches).

Defaults (uncertain figures, override per config):
- NGRAM_FRACTION_OF_STEP = 0.005875: n-gram drafting time as a share of verification, Llama-3.1-8B
  on H100 (SpecDecode-Bench simulator, predictor.py `ngram_draft_percentage`, arXiv 2601.11580).
- EAGLE3_DRAFT_OVERHEAD_S = 1.10e-3: per-step drafting time the EAGLE-3 head's roofline does not
  see (input preparation, per-pass metadata updates, eager launches between CUDA graphs):
  SpecDecode-Bench's fit of the EAGLE-3 drafter on H100 for Llama-3.1-8B, vLLM v0.10.1
  (predictor.py: 2.135 ms fixed + 0.84 us per draft token + 2.4 ns per KV token; 2.14 ms at batch
  1, k = 3) minus our roofline of that head's real shape (above) there, 1.04 ms.
- DRAFT_OVERHEAD_S = 0.5e-3 for the other drafters: the same measurement minus the 1.60 ms our
  roofline gave when it priced the EAGLE-3 head as a target-shaped layer with the target's LM
  head (EAGLE-1's shape); the study measured no other drafter on its own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError, require

from .l2_cache import ElementwiseOp
from .kv_layout import KVCacheLayout
from .kv_memory import kv_bytes_per_token, kv_cache_blocks, kv_cache_memory_bytes, weight_bytes_per_gpu
from .models import ModelSpec, get_model

NGRAM_FRACTION_OF_STEP = 0.005875
DRAFT_OVERHEAD_S = 0.5e-3
EAGLE3_DRAFT_OVERHEAD_S = 1.10e-3
#: draft_vocab_size of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (its config.json, as copied by SGLang;
#: also the default of the EAGLE-3 training configs in SpecForge and vllm-project/speculators).
EAGLE3_DRAFT_VOCAB_SIZE = 32000
#: Target layers whose hidden states EAGLE-3 fuses (vLLM: layers 2, L/2 and L-3).
EAGLE3_AUX_LAYERS = 3
#: Bytes the rejection sampler moves per verified logit (fp32, 4 B), counted from vLLM V1's
#: rejection_sampler.py / topk_topp_sampler.py code path (our count, not a measurement):
#: - greedy: one argmax read (4).
#: - random: temperature divide in place (8), softmax to fp32 probs (max and sum reads, write:
#:   12), recovered-token kernel reading the probs and the exponential noise (8): 28.
#: - top_p (top-p and/or top-k): random + apply_top_k_top_p: torch.sort of fp32 keys with int64
#:   indices as a 4-pass 8-bit radix sort, each pass reading and writing 12 B (96), softmax over
#:   the sorted rows (12), cumsum (8), mask (5), masked_fill (8), scatter back to vocabulary
#:   order (16): 173.
SAMPLER_BYTES_PER_LOGIT = {"greedy": 4.0, "random": 28.0, "top_p": 173.0}
#: Launches the sampler's bytes are spread over (softmax, sort, mask and the recovered-token kernel).
SAMPLER_LAUNCHES = 4
HEAD_METHODS = ("eagle", "eagle3", "mtp")
#: Breakdown families that depend on how rows split into prefill and decode (the rest see tokens only).
ATTENTION_KEYS = ("prefill_attention", "decode_attention")


def verify_step_time(cost_model, batch: BatchShape, drafts: list[int]) -> float:
    """Seconds for a step whose row i verifies `drafts[i]` draft tokens (0: a plain row).

    Needs a cost model with a per-family `breakdown` (the roofline ones); a model without one (the
    linear model, which does not tell prefill from decode) prices the batch as it is."""
    if not any(drafts):
        return cost_model.step_time(batch)
    breakdown = getattr(cost_model, "breakdown", None)
    whole = breakdown(batch) if breakdown is not None else {}
    if "decode_attention" not in whole:
        return cost_model.step_time(batch)
    new, ctx = list(batch.num_new_tokens), list(batch.num_context_tokens)
    for i, k in enumerate(drafts):
        if k and new[i] == k + 1:        # last token + k drafts: one decode row over all its keys
            new[i], ctx[i] = 1, ctx[i] + k
    rows = breakdown(BatchShape(new, ctx, batch.num_sampled))
    return (sum(v for key, v in whole.items() if key not in ATTENTION_KEYS)
            + sum(rows[key] for key in ATTENTION_KEYS))


def default_draft_overhead(method: str) -> float:
    """Per-step drafting time outside the roofline, by method (see the module docstring)."""
    return EAGLE3_DRAFT_OVERHEAD_S if method == "eagle3" else DRAFT_OVERHEAD_S


def drafter_spec(method: str, target, draft_model=None) -> ModelSpec | None:
    """The network that drafts: a one-layer head of the target's shape, the draft model, or None. The
    head's one layer is of the target's later kind (DeepSeek-V3's MTP block is a MoE block, though its
    first three layers are dense) and runs full attention: a hybrid target's per-layer kinds (sliding,
    chunked, linear) describe its own layers, not the head's (Qwen3-Next's MTP layer and the EAGLE heads
    are full-attention layers). Only an MTP head is the target's own layer, with its q/k norms."""
    if method in HEAD_METHODS:
        spec = get_model(target)
        return replace(spec, name=f"{spec.name}-{method}-head", num_layers=1, first_k_dense_replace=0,
                       layer_types=(), qk_norm_layers=min(spec.qk_norm_layers, 1) if method == "mtp" else 0)
    if method == "draft_model":
        require(draft_model is not None, "speculative_config.model", draft_model, "draft_model needs a model")
        try:
            return get_model(draft_model)
        except ConfigError as exc:  # (get_model names the deployment's field)
            raise ConfigError("speculative_config.model", draft_model, exc.reason) from None
    return None


@dataclass(frozen=True)
class DraftShape:
    """What an EAGLE head adds to a one-layer target-shaped pass (None fields: nothing).

    fc: the fold into hidden; on every pass (`fc_every_pass`, EAGLE-1) or on the first pass's
    rows only (EAGLE-3's fusion of the target's hidden states).
    vocab_expand: draft vocabulary -> target vocabulary per sampled row and pass (EAGLE-3):
    `target_vocab` and `draft_vocab` entries of `dtype_bytes`, priced by `elementwise`."""

    fc: object | None = None
    fc_every_pass: bool = False
    target_vocab: int = 0
    draft_vocab: int = 0
    dtype_bytes: float = 2.0
    elementwise: object | None = None

    def first_pass(self, rows: int, sampled: int) -> float:
        return self._fc(rows) + self._expand(sampled)

    def later_pass(self, rows: int) -> float:
        return (self._fc(rows) if self.fc_every_pass else 0.0) + self._expand(rows)

    def _fc(self, rows: int) -> float:
        return self.fc.time(rows, self.dtype_bytes) if self.fc is not None and rows else 0.0

    def _expand(self, rows: int) -> float:
        """new_full(-inf) over the target vocabulary, a scatter of the draft logits (with the
        int64 table), an argmax over the target vocabulary: three launches plus arange and add."""
        if not self.draft_vocab or not rows or self.elementwise is None:
            return 0.0
        b = self.dtype_bytes
        nbytes = rows * (2 * self.target_vocab * b + self.draft_vocab * (2 * b + 8))
        return self.elementwise.launches(5, nbytes)


def head_cost_model(method: str, head, draft_vocab_size: int | None = None):
    """The EAGLE head's cost model and `DraftShape` from `head`, the roofline model of a one-layer
    head of the target's shape: EAGLE-3's qkv_proj reads 2 x hidden and its LM head covers the
    draft vocabulary; EAGLE-1 adds its 2 x hidden -> hidden fc. Other methods and models without
    separate matmuls (the shaped and linear models) come back as they are."""
    from .cost_model import RooflineCostModel
    from .operators import matmul_operator
    if method not in ("eagle", "eagle3") or not isinstance(head, RooflineCostModel):
        return head, None
    if method == "eagle":
        fc = matmul_operator(head.calibration, "matmul", 2 * head.hidden, head.hidden)
        return head, DraftShape(fc=fc, fc_every_pass=True, dtype_bytes=head.dtype_bytes)
    return _eagle3_head(head, draft_vocab_size)


def _eagle3_head(head, draft_vocab_size: int | None):
    """EAGLE-3: qkv over 2 x hidden, an LM head over the draft vocabulary, the three-layer fc and
    the map back to the target's vocabulary (none when the draft vocabulary is the target's)."""
    from .operators import matmul_operator
    cal, h, tp, target_vocab = head.calibration, head.hidden, head.tensor_parallel_size, head.model.vocab_size
    vocab = min(EAGLE3_DRAFT_VOCAB_SIZE, target_vocab) if draft_vocab_size is None else draft_vocab_size
    require(isinstance(vocab, int) and 1 <= vocab <= target_vocab, "speculative_config.draft_vocab_size",
            vocab, f"must be an integer in [1, {target_vocab}] (the target's vocabulary)")
    eagle3 = replace(head, qkv=matmul_operator(cal, "qkv_proj", 2 * h, head.q_gpu + 2 * head.kv_gpu),
                     lm_head=matmul_operator(cal, "lm_head", h, vocab / tp))
    mapped = vocab < target_vocab
    shape = DraftShape(fc=matmul_operator(cal, "matmul", EAGLE3_AUX_LAYERS * h, h),
                       target_vocab=target_vocab if mapped else 0, draft_vocab=vocab if mapped else 0,
                       dtype_bytes=head.dtype_bytes, elementwise=head.add)
    return eagle3, shape


@dataclass(frozen=True)
class RejectionSampler:
    """Seconds the rejection sampler spends on the target's logits: `bytes_per_logit`
    (SAMPLER_BYTES_PER_LOGIT by sampling mode) over every verified position's `vocab` logits."""

    vocab: int
    bytes_per_logit: float
    elementwise: ElementwiseOp

    def __call__(self, positions: int) -> float:
        if not positions:
            return 0.0
        return self.elementwise.launches(SAMPLER_LAUNCHES, positions * self.vocab * self.bytes_per_logit)


def rejection_sampler(cost_model, vocab_size: int, sampling: str = "greedy") -> RejectionSampler | None:
    """The sampler's cost over the target's `vocab_size` logits (gathered whole on every rank) at
    the elementwise bandwidth of `cost_model` (any roofline model on the target's GPU); None for a
    model without roofline coefficients (the linear model)."""
    require(sampling in SAMPLER_BYTES_PER_LOGIT, "speculative_config.target_sampling", sampling,
            f"must be one of {tuple(SAMPLER_BYTES_PER_LOGIT)}")
    c = getattr(getattr(cost_model, "base", cost_model), "add", None)
    if c is None:
        return None
    return RejectionSampler(vocab_size, SAMPLER_BYTES_PER_LOGIT[sampling], c)


@dataclass(frozen=True)
class ProposerCost:
    """Seconds speculation adds to a step after the target pass: the rejection sampler (`sampler`,
    None: not priced) and the proposer. `draft` prices one drafter pass (None for n-gram);
    `shape` adds the EAGLE heads' own pieces (DraftShape)."""

    method: str
    num_speculative_tokens: int
    draft: object | None = None
    draft_overhead_s: float = DRAFT_OVERHEAD_S
    ngram_fraction_of_step: float = NGRAM_FRACTION_OF_STEP
    tree_widths: tuple[int, ...] | None = None
    shape: DraftShape | None = None
    sampler: RejectionSampler | None = None

    def __call__(self, batch: BatchShape, proposing_context: list[int], target_s: float,
                 drafts: list[int] | None = None) -> float:
        """Time to verify and propose the next drafts of the rows that sampled
        (`proposing_context`: their tokens in KV after this step) after a target step of
        `target_s` seconds over `batch` (`drafts`: drafts verified per row; the drafter's first
        pass runs the same rows, priced likewise)."""
        sampling = self.sampler(sum(d + 1 for d in drafts if d)) if self.sampler and drafts else 0.0
        return sampling + self._propose(batch, proposing_context, target_s, drafts)

    def _propose(self, batch: BatchShape, proposing_context: list[int], target_s: float,
                 drafts: list[int] | None) -> float:
        m = len(proposing_context)
        if not m:
            return 0.0
        if self.draft is None:
            return self.ngram_fraction_of_step * target_s
        first_batch = BatchShape(batch.num_new_tokens, batch.num_context_tokens, m)
        first = verify_step_time(self.draft, first_batch, drafts or [0] * batch.num_reqs)
        if self.shape is not None:
            first += self.shape.first_pass(sum(batch.num_new_tokens), m)
        widths = self.tree_widths[:-1] if self.tree_widths else (1,) * (self.num_speculative_tokens - 1)
        passes = sum(self._pass(w, m, proposing_context) * widths.count(w) for w in set(widths))
        return self.draft_overhead_s + first + passes

    def _pass(self, width: int, m: int, context: list[int]) -> float:
        """One drafting pass over `width` tokens of each of `m` requests."""
        batch = BatchShape([width] * m, context, m * width)
        extra = self.shape.later_pass(m * width) if self.shape is not None else 0.0
        return verify_step_time(self.draft, batch, [width - 1] * m) + extra


def proposer_kv_cache_blocks(target, gpu, drafter: ModelSpec | None, tensor_parallel_size: int = 1,
                             block_size: int = 16, gpu_memory_utilization: float = 0.9,
                             max_num_batched_tokens: int = 8192, *, kv_cache_dtype: str = "auto",
                             max_num_seqs: int = 256, cudagraph_memory_bytes: int = 0,
                             layout: KVCacheLayout | None = None) -> int:
    """KV blocks when the drafter's weights and its own KV per token share the GPU with the target
    (the other arguments as `kv_cache_blocks`'s).

    `layout`: the layout the run holds, the drafter's layers in it (KVCacheLayout.with_drafter_layers,
    with_speculative_state; every layer as full attention where vLLM turns its hybrid manager off). Given,
    the memory left after the drafter's weights is cut into blocks of that layout, as vLLM sizes a hybrid
    target's pool with the drafter's layers grouped in. Without it, the drafter's KV per token is added
    to the target's (every layer full attention: a plain target)."""
    blocks = kv_cache_blocks(target, gpu, tensor_parallel_size, block_size, gpu_memory_utilization,
                             max_num_batched_tokens, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                             cudagraph_memory_bytes=cudagraph_memory_bytes)
    if drafter is None:
        return blocks
    weights = weight_bytes_per_gpu(drafter, tensor_parallel_size, gpu)
    if layout is not None:
        free = kv_cache_memory_bytes(target, gpu, tensor_parallel_size, gpu_memory_utilization,
                                     max_num_batched_tokens, max_num_seqs, cudagraph_memory_bytes) - weights
        require(free >= layout.block_bytes, "speculative_config.model", drafter.name,
                "the drafter's weights leave no room for the KV cache")
        return int(free // layout.block_bytes)
    target_kv = kv_bytes_per_token(target, tensor_parallel_size, kv_cache_dtype) * block_size
    freed = blocks * target_kv - weights
    per_block = target_kv + kv_bytes_per_token(drafter, tensor_parallel_size, kv_cache_dtype) * block_size
    require(freed > 0, "speculative_config.model", drafter.name,
            "the drafter's weights leave no room for the KV cache")
    return int(freed // per_block)
