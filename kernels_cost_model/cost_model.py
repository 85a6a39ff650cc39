"""The step-time model the engine calls: per-operator roofline of one mixed batch.

`make_cost_model` (builder.py) does all the work up front (catalog lookups, calibration, per-GPU shapes)
and hands back this frozen object whose `step_time` folds the batch into a handful of aggregates (decode count and
context sum by C-level list scans, then a short loop over the few prefill rows) and then prices a
fixed list of operators.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from kernels_cost_model.batch import BatchShape

from .attention_backend import imbalance_alpha
from .batch_fold import _fold_prefill_rows
from .prefill_waves import TILE_ROWS, batch_path_keys, decode_path, sequence_units
from . import mixed_launch as _ml
from .collectives import CollectiveCurve
from .decode_stretch import SEQUENTIAL_SUM, decode_step_time
from .calibration import Calibration
from .hardware import GPU
from .l2_cache import ElementwiseOp
from .models import ModelSpec
from .operators import FusedMoE, MatmulOp
from .roofline import Coeffs
from .scheduler_cpu import default_scheduler_cpu

#: Engine CPU time per step: base + per scheduled request + per scheduled token, our own measurement
#: of vLLM's scheduler (schedule() + update_from_output()) on one CPU (scheduler_cpu.py, its source in
#: CPU_SOURCE; benchmarks/measure_scheduler_cpu.py). A serving host's CPU differs: the per-request
#: figure can be set per deployment (`cpu_per_request_s`) or fitted by `servesim calibrate --from-run`.
_MEASURED_CPU = default_scheduler_cpu()
CPU_BASE_S, CPU_PER_REQUEST_S, CPU_PER_TOKEN_S = (_MEASURED_CPU.base_s, _MEASURED_CPU.per_request_s,
                                                  _MEASURED_CPU.per_token_s)
CPU_SOURCE = _MEASURED_CPU.source

#: Operator families in a breakdown, in pricing order.
BREAKDOWN_KEYS = ("qkv_proj", "o_proj", "mlp", "moe_routing", "prefill_attention", "decode_attention",
                  "norms_activations", "lm_head", "all_reduce", "cpu")



STEP_MEMO_ROWS = 4      # batches of at most this many rows are priced once per distinct batch
STEP_MEMO_SIZE = 1 << 16


@dataclass(frozen=True, slots=True)
class RooflineCostModel:
    """Prices a `BatchShape` in seconds. Build with `make_cost_model`; all fields are precomputed."""

    model: ModelSpec
    gpu: GPU
    tensor_parallel_size: int
    calibration: Calibration
    cpu_overhead: bool
    layers: float
    dtype_bytes: float
    hidden: float
    q_gpu: float           # query width on one GPU (heads x head_dim / tp)
    kv_gpu: float          # key (= value) width on one GPU
    heads_gpu_x_hd: float  # heads on one GPU x head_dim
    inter_gpu: float       # MLP intermediate width per GPU (per expert for MoE)
    experts: float
    top_k: float
    qkv: MatmulOp
    o: MatmulOp
    up: MatmulOp
    down: MatmulOp
    router: MatmulOp | None
    lm_head: MatmulOp
    prefill: Coeffs
    decode: Coeffs
    norm: ElementwiseOp
    act: ElementwiseOp
    rope: ElementwiseOp
    add: ElementwiseOp
    embed: ElementwiseOp
    all_reduce: Coeffs
    mixed_decode: tuple[float, float] = (0.0, 0.0)  # s/byte per query head, per KV head; see attention_backend
    all_reduce_curve: CollectiveCurve | None = None  # measured time by size for tp ranks (collectives.py)
    all_gather_curve: CollectiveCurve | None = None
    #: vLLM's async scheduling: the engine's CPU work for the next step overlaps this step's GPU work,
    #: so a step lasts max(GPU, CPU) instead of GPU + CPU.
    async_scheduling: bool = False
    #: Multiplier on every collective's measured (or modelled) time: 1 = the microbenchmark figures.
    #: A host whose serving collectives run slower than its sweep (see docs/fidelity.md) sets it.
    collective_scale: float = 1.0
    #: Engine time per scheduled request per step (the CPU term's slope; CPU_PER_REQUEST_S by default).
    cpu_per_request_s: float = CPU_PER_REQUEST_S
    #: The experts as one measured FusedMoE operator (calibrations with MoE kernels); None = grouped matmuls.
    fused_moe: FusedMoE | None = None
    #: vLLM's CUDA-graph capture sizes (cuda_graph.py); a batch of up to the largest runs padded to
    #: the next one (empty = eager: no padding).
    cuda_graph_sizes: tuple[int, ...] = ()
    #: Measured imbalance of decodes with different contexts in one launch: (alone, beside a chunk)
    #: (decodes, alpha) points (attention_backend.decode_imbalance); None = priced at the mean context.
    decode_imbalance: tuple | None = None
    #: FA2 prefill: SMs its 64-row units run on (0 = not an FA2 GPU: the longest row is the path), query
    #: heads per GPU, keys per block (prefill_waves.py).
    prefill_waves: tuple[int, float, int] = (0, 0.0, 0)
    #: FA2 decode: SMs (0 = not an FA2 GPU: the longest row is the path), query and KV heads per GPU, keys
    #: per block, and the key blocks of max_model_len a captured graph's split count is decided at
    #: (prefill_waves.decode_path).
    decode_waves: tuple[int, float, float, int, int] = (0, 0.0, 0.0, 0, 0)
    #: The GPUs the two attention mechanisms above come from: (("mixed_decode", gpus), ("decode_imbalance",
    #: gpus)); the GPU itself where it has rows, the donors where derived (derived_mechanisms.py).
    mechanism_sources: tuple = ()
    #: FA2 decodes beside a prefill chunk as units of the chunk's launch (mixed_launch.py): (L2 bytes, s per
    #: byte of DRAM re-reads); () = the measured mixed-batch rates price them (attention_backend.py).
    mixed_launch: tuple = ()
    #: Layers that RMS-normalise each query and key head before RoPE (Qwen3, Gemma-3: ModelSpec.qk_norm_layers):
    #: one launch of the RMSNorm operator a layer whose rows are the q and k heads (LLMServingSim times it as one).
    qk_norm_layers: float = 0.0
    #: Factor the calibration's compute coefficients were scaled by for the clock a busy GPU's power cap
    #: holds (power_cap.py; 1.0: the kernel tables' burst clocks).
    compute_clock_factor: float = 1.0
    #: Prices of small batches that are not pure decodes, by their rows (a prefill step's few rows
    #: recur: prompt lengths and prefix hits repeat); cleared past STEP_MEMO_SIZE entries.
    step_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- public API -------------------------------------------------------------------------
    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one engine step (GPU forward + engine CPU time); a pure function of the batch.
        A pure-decode batch is priced from terms kept per batch size (decode_stretch.py, same result),
        a batch of up to STEP_MEMO_ROWS other rows once per distinct batch (`step_memo`)."""
        new = batch.num_new_tokens
        n = len(new)
        if n and batch.num_sampled == n and SEQUENTIAL_SUM and new.count(1) == n:
            ctx = batch.num_context_tokens
            return decode_step_time(self, n, sum(ctx), max(ctx))
        if n > STEP_MEMO_ROWS:
            return sum(self._terms(batch))
        key = (*new, *batch.num_context_tokens, batch.num_sampled)  # (its length tells the rows apart)
        memo = self.step_memo
        price = memo.get(key)
        if price is None:
            if len(memo) >= STEP_MEMO_SIZE:
                memo.clear()
            price = memo[key] = sum(self._terms(batch))
        return price

    def breakdown(self, batch: BatchShape, pad_to: int = 0) -> dict[str, float]:
        """Seconds per operator family; the values add up to `step_time(batch)`. `pad_to`: run the
        forward pass's token-wise operators at no fewer tokens than this (a DP rank padded to the
        largest rank's graph size, expert_parallel.py); -1: at the batch's own tokens, unpadded (a DP
        rank run eagerly because another rank's batch fits no graph)."""
        return dict(zip(BREAKDOWN_KEYS, self._terms(batch, pad_to=pad_to)))

    def layer_seconds(self, batch: BatchShape):
        """The batch's seconds by layer, for pipeline stages (stage_times.py)."""
        from .stage_times import roofline_layer_seconds
        return roofline_layer_seconds(self, batch)

    # -- pricing ----------------------------------------------------------------------------
    def _terms(self, batch: BatchShape, guard: bool = True, pad_to: int = 0) -> tuple[float, ...]:
        new, ctx = batch.num_new_tokens, batch.num_context_tokens
        n = len(new)
        n_dec = new.count(1)
        if n_dec < n:
            pf_tok, pf_ctx, pf_pairs, pf_tile, n_pf, idle_ctx, pf_keys, pf_rows = _fold_prefill_rows(new, ctx, n_dec)
            pf_top = pf_keys  # the longest chunk row's keys (context + chunk)
            if self.prefill_waves[0]:  # FA2: the prefill units' waves over the SMs (prefill_waves.py)
                sms, heads, block = self.prefill_waves
                pf_keys = batch_path_keys(*(pf_rows or (new, ctx)), heads, sms, block)
        else:
            pf_tok = pf_ctx = pf_pairs = pf_tile = n_pf = idle_ctx = pf_keys = pf_top = 0
        tokens = n_dec + pf_tok
        cpu = self._cpu_s(n, tokens)
        if tokens <= 0:
            return (0.0,) * (len(BREAKDOWN_KEYS) - 1) + (cpu,)
        dec_keys = raw_keys = sum(ctx) - pf_ctx - idle_ctx + n_dec  # keys read by decode rows (context + new token)
        if self.decode_imbalance is not None and n_dec > 1:
            dec_keys = self._imbalanced(dec_keys, new, ctx, n_dec, n_pf > 0)
        # the decodes' critical path: their longest row's keys (max(ctx) + 1 when every row is a decode;
        # a chunk's own path is priced at the prefill fit's key cost, pf_keys). Rows with no new tokens
        # read nothing.
        longest = 0
        if n_dec:
            longest = (max(c for k, c in zip(new, ctx) if k == 1) if n_dec < n else max(ctx)) + 1
            if self.decode_waves[0] and not n_pf:  # FA2, decodes alone: the split-KV units' waves
                longest = decode_path(n_dec, longest, *self.decode_launch(n_dec), raw_keys / n_dec)
        mixed = None
        if n_pf and n_dec and self.mixed_launch and self.prefill.s_per_key:  # FA2 path form (prefill_waves.py)
            mixed = self._mixed_launch(new, ctx, pf_rows, pf_keys, n_dec, raw_keys)
        gpu = self._price(max(self._padded(tokens), pad_to) if pad_to >= 0 else tokens, batch.num_sampled, n_dec, dec_keys, n_pf, pf_tok, pf_ctx, pf_pairs,
                          pf_tile, (pf_keys, longest), mixed)
        if n_pf and guard:  # all rows as decodes: raw keys + each chunk's context + chunk, the longest row
            gpu = self._no_cheaper_than_decodes(new, ctx, batch.num_sampled, gpu, n_dec, n_pf,
                                                raw_keys + pf_ctx + pf_tok, max(longest, pf_top))
        if self.async_scheduling:  # only the CPU time the GPU work does not cover shows
            cpu = max(0.0, cpu - sum(gpu))
        return gpu + (cpu,)

    def _no_cheaper_than_decodes(self, new: list, ctx: list, sampled: int, gpu: tuple, n_dec: int, n_pf: int,
                                 keys: float, top: float) -> tuple:
        """The step's attention, never below that of its rows run as decodes where a decode could turn
        into one of its chunks (`keys`, `top`: the keys of all rows as decodes, of the longest).

        Prefill and decode rows are priced at their own families' fits, and on FA2 GPUs their launches
        differ (a decode launch's split-KV units and combine step against a chunk's 64-row tiles): the
        RTX PRO 6000's vLLM 0.19 decode fit pays 12.5 us a launch, its prefill fit 4.8 us (Qwen3-30B-A3B
        TP2), so a fresh chunk of up to ~256 tokens alone is priced (and measured) below a decode over
        its keys. The guard keeps a step from getting cheaper when a decode row becomes a chunk, without
        lifting prefill-only steps: a step with decodes or 2-token chunks beside its chunks costs at least
        all its rows run as decodes (each chunk a decode reading its keys), and at least the same batch
        with only its 2-token chunks run as decodes. A lifted step's attention is that batch's, term by
        term (its breakdown shows those rows as decodes).
        """
        twos = new.count(2)
        floor = self._as_decodes(n_dec + n_pf, keys, top) if n_dec or twos else (0.0, 0.0)
        if twos and (not n_dec or twos < n_pf):  # 2-token chunks beside bigger ones (else the same batch)
            demoted = self._attention_of([1 if c == 2 else c for c in new],
                                         [p + 1 if c == 2 else p for c, p in zip(new, ctx)], sampled)
            floor = demoted if demoted[0] + demoted[1] > floor[0] + floor[1] else floor
        if floor[0] + floor[1] <= gpu[4] + gpu[5]:
            return gpu
        return gpu[:4] + floor + gpu[6:]

    def _as_decodes(self, n: int, raw_keys: float, top: float) -> tuple[float, float]:
        """(prefill, decode) attention seconds of `n` decodes alone reading `raw_keys` keys in all, the
        longest `top` (as `_terms` prices a batch of decodes alone)."""
        dec_keys = raw_keys
        if self.decode_imbalance is not None and n > 1:
            alpha = imbalance_alpha(self.decode_imbalance[0], n)
            dec_keys = raw_keys + alpha * (n * top - raw_keys)
        longest = top
        if self.decode_waves[0]:
            longest = decode_path(n, top, *self.decode_launch(n), raw_keys / n)
        pf, dec = self._attention(n, dec_keys, 0, 0, 0, 0, 0, (0, longest))
        return self.layers * pf, self.layers * dec

    def _attention_of(self, new: list, ctx: list, sampled: int) -> tuple[float, float]:
        """(prefill, decode) attention seconds of the batch of rows (`new`, `ctx`), unguarded."""
        terms = self._terms(BatchShape(new, ctx, sampled), guard=False)
        return terms[4], terms[5]

    def decode_launch(self, n_dec: int) -> tuple:
        """decode_path's (query heads, KV heads, SMs, keys per block, decided_at) for `n_dec` decodes alone:
        a batch of up to the largest capture size replays a full CUDA graph whose split count was decided
        at capture (the padded size, max_model_len); a larger one launches eagerly. Beside a prefill chunk
        the decodes are not swapped: they are units of the chunk's launch (mixed_launch.py)."""
        sms, heads, kv, block, capture_blocks = self.decode_waves
        sizes = self.cuda_graph_sizes
        captured = capture_blocks and sizes and n_dec <= sizes[-1]
        return heads, kv, sms, block, ((self._padded(n_dec), capture_blocks) if captured else None)

    def _mixed_launch(self, new: list, ctx: list, pf_rows, pf_path: float, n_dec: int,
                      raw_keys: float) -> tuple[float, float, float]:
        """(path keys, seconds of fixed unit costs, DRAM bytes of the decodes' K/V) of a launch of decodes
        beside prefill chunks on an FA2 GPU (mixed_launch.py)."""
        sms, heads, block = self.prefill_waves
        pf_new, pf_ctx = pf_rows or (new, ctx)
        tiles = keys = top = 0.0
        for c, p in zip(pf_new, pf_ctx):
            if c > 1:
                t, k = sequence_units(c, p, block)
                tiles, keys = tiles + t, keys + k
                top = max(top, -(-(c + p) // block) * block)
        dec_blocks = [-(-(c + 1) // block) for k, c in zip(new, ctx) if k == 1]
        dec_keys, dec_top = block * sum(dec_blocks), block * max(dec_blocks)
        path, waves = _ml.mixed_path(pf_path, keys, tiles, top, dec_keys, dec_top, n_dec, heads, sms)
        empty = heads * n_dec * (-(-max(pf_new) // TILE_ROWS) - 1)  # decode rows' query tiles past their one row
        fixed = _ml.fixed_s(waves, empty, sms)
        group = heads / self.decode_waves[2]
        slice_bytes = self.dtype_bytes * 2.0 * dec_keys * self.model.head_dim  # one KV head's K/V, all decodes
        reads = _ml.dram_reads(group, n_dec + tiles, sms, slice_bytes, self.mixed_launch[0])
        return path, fixed, self.dtype_bytes * 2.0 * raw_keys * self.kv_gpu * reads

    def _cpu_s(self, num_reqs: int, tokens: int) -> float:
        """The engine's CPU time for a step of `num_reqs` requests and `tokens` tokens (before overlap)."""
        return (CPU_BASE_S + self.cpu_per_request_s * num_reqs + CPU_PER_TOKEN_S * tokens) if self.cpu_overhead else 0.0

    def _imbalanced(self, dec_keys: float, new: list, ctx: list, n_dec: int, mixed: bool) -> float:
        """Decode keys as the launch prices them: mean + alpha x (longest - mean) per row, alpha as
        measured for this many decodes alone or beside a chunk (attention_backend.py)."""
        longest = max(c for k, c in zip(new, ctx) if k == 1) + 1
        alpha = imbalance_alpha(self.decode_imbalance[1 if mixed else 0], n_dec)
        return dec_keys + alpha * (n_dec * longest - dec_keys)

    def _padded(self, tokens: int) -> int:
        """Tokens the forward pass runs: vLLM pads a batch to the next CUDA-graph capture size."""
        sizes = self.cuda_graph_sizes
        if not sizes or tokens > sizes[-1]:
            return tokens
        return sizes[bisect_left(sizes, tokens)]

    def _price(self, t: float, sampled: int, n_dec: int, dec_keys: float, n_pf: int, pf_tok: float,
               pf_ctx: float, pf_pairs: float, pf_tile: float, longest: tuple, mixed=None) -> tuple[float, ...]:
        d, L = self.dtype_bytes, self.layers
        qkv = self.qkv.time(t, d)
        o = self.o.time(t, d)
        if self.router is None:
            mlp, routing = self.up.time(t, d) + self.down.time(t, d), 0.0
            act_width = self.inter_gpu
        else:
            mlp, routing = self._moe(t, d)
            act_width = self.inter_gpu * self.top_k
        if mixed is None:
            attn_pf, attn_dec = self._attention(n_dec, dec_keys, n_pf, pf_tok, pf_ctx, pf_pairs, pf_tile, longest)
        else:
            attn_pf, attn_dec = self._mixed_attention(n_dec, n_pf, pf_tok, pf_ctx, longest[0], mixed)
        h = self.hidden
        rope_width = self.q_gpu + self.kv_gpu
        norm = self.norm.cost(d * (2.0 * t * h + h), t, d * h)
        norms = (2.0 * norm + 2.0 * self.add.cost(d * 3.0 * t * h, t, d * h)
                 + self.act.cost(d * 3.0 * t * act_width, t, d * act_width)
                 + self.rope.cost(d * 2.0 * t * rope_width, t, d * rope_width))
        once = self.embed.cost(d * 2.0 * t * h, t, d * h) + norm
        layer_norms = L * norms
        if self.qk_norm_layers:  # each q and k head a row, read and written in place, plus both norms' weights
            hd = self.model.head_dim
            qk = self.norm.cost(d * (2.0 * t * rope_width + 2.0 * hd), t * rope_width / hd, d * hd)
            layer_norms = layer_norms + self.qk_norm_layers * qk
        lm = self.lm_head.time(sampled, d) if sampled else 0.0
        ar = 0.0
        tp = self.tensor_parallel_size
        if tp > 1:  # two all-reduces per layer, one after the vocabulary-parallel embedding; vLLM v1
            c, arc, agc = self.all_reduce, self.all_reduce_curve, self.all_gather_curve  # all-gathers the
            if arc is not None:                                   # sampled rows' vocabulary-sharded logits
                ar = (2.0 * L + 1.0) * arc.time(d * t * h)
            else:
                ar = (2.0 * L + 1.0) * (2.0 * (tp - 1) / tp * d * t * h * c.s_per_byte + c.overhead_s)
            if sampled and agc is not None:
                lm += self.collective_scale * agc.time(d * sampled * self.model.vocab_size / tp)
            elif sampled:
                lm += self.collective_scale * ((tp - 1) / tp * d * sampled * self.model.vocab_size * c.s_per_byte
                                               + c.overhead_s)
        return (L * qkv, L * o, L * mlp, L * routing, L * attn_pf, L * attn_dec, layer_norms + once,
                lm, ar * self.collective_scale)

    def _attention(self, n_dec: int, dec_keys: float, n_pf: int, pf_tok: float, pf_ctx: float,
                   pf_pairs: float, pf_tile: float, longest: tuple) -> tuple[float, float]:
        """One varlen attention launch over all rows (as vLLM v1 runs it), split for the breakdown.

        Prefill rows price their FLOPs and bytes at the prefill coefficients, decode rows at the decode
        ones; each kind takes the longer of its compute and its memory, and the launch takes both kinds'
        times + one launch overhead. A flash-attention kernel holds one CTA per SM, so a chunk's
        compute-bound tiles and the decodes' memory-bound ones share no SM and do not hide each other:
        FlashAttention-3's mixed launches on the H100 and H200 take 95-99 % of their two parts run one
        after the other (benchmarks/fa3_mixed_launch.py), where max(total compute, total memory) priced
        them up to 46 % lower. Each kind's part only grows with its rows, so the step stays monotone.
        """
        if not (n_pf or n_dec):
            return 0.0, 0.0
        d, pf, dc = self.dtype_bytes, self.prefill, self.decode
        hx = 4.0 * self.heads_gpu_x_hd
        # FA2: a prefill's compute is its waves of units, priced in the path below (prefill_waves.py)
        c_pf = 0.0 if self.prefill_waves[0] else hx * (pf_pairs + pf.tile_rows * pf_tile) * pf.s_per_flop
        m_pf = d * (2.0 * pf_tok * self.q_gpu + 2.0 * (pf_ctx + pf_tok) * self.kv_gpu) * pf.s_per_byte
        if pf_ctx and not self.prefill_waves[0]:  # the cached context at least at the decode fit's read rate
            floor = d * 2.0 * pf_ctx * self.kv_gpu * dc.s_per_byte  # (roofline.prefill_context_bytes)
            m_pf = floor if floor > m_pf else m_pf
        c_dec = hx * dec_keys * (1.0 + dc.tile_rows) * dc.s_per_flop
        m_dec = d * (2.0 * n_dec * self.q_gpu + 2.0 * dec_keys * self.kv_gpu) * dc.s_per_byte
        sq, skv = self.mixed_decode
        if n_pf and sq:  # FA2 beside a prefill chunk: no GQA packing (attention_backend.py)
            m_mixed = d * 2.0 * ((n_dec + dec_keys) * self.q_gpu * sq + dec_keys * self.kv_gpu * skv)
            m_dec = m_mixed if m_mixed > m_dec else m_dec
        pf_path, dec_path = longest[0] * pf.s_per_key, longest[1] * dc.s_per_key  # the longest row's keys:
        overhead = ((pf.overhead_s if n_pf else dc.overhead_s) + n_pf * pf.s_per_seq + n_dec * dc.s_per_seq
                    + (pf_path if pf_path > dec_path else dec_path))        # the launch's critical path
        alone_pf = (c_pf if c_pf > m_pf else m_pf) if n_pf else 0.0
        alone_dec = (c_dec if c_dec > m_dec else m_dec) if n_dec else 0.0
        total = alone_pf + alone_dec + overhead
        share_pf = alone_pf / (alone_pf + alone_dec) if alone_pf + alone_dec > 0.0 else 0.5
        return total * share_pf, total * (1.0 - share_pf)

    def _mixed_attention(self, n_dec: int, n_pf: int, pf_tok: float, pf_ctx: float, pf_path: float,
                         mixed: tuple) -> tuple[float, float]:
        """A launch of decodes beside prefill chunks on an FA2 GPU (mixed_launch.py): max(bytes, the units'
        path, the chunks alone) + the launch overhead; split for the breakdown at the chunks alone."""
        d, pf, dc = self.dtype_bytes, self.prefill, self.decode
        path, fixed, dec_dram = mixed
        m_pf = d * (2.0 * pf_tok * self.q_gpu + 2.0 * (pf_ctx + pf_tok) * self.kv_gpu) * pf.s_per_byte
        memory = m_pf + (d * 2.0 * n_dec * self.q_gpu + dec_dram) * self.mixed_launch[1]
        alone = m_pf + pf_path * pf.s_per_key
        units = path * pf.s_per_key + fixed
        core = max(memory, units, alone)
        overhead = pf.overhead_s + n_pf * pf.s_per_seq
        return alone + overhead, core - alone + n_dec * dc.s_per_seq

    def _moe(self, t: float, d: float) -> tuple[float, float]:
        """Experts as the measured fused operator, or as grouped matmuls over the experts a batch
        touches (router and permutes apart)."""
        e, k = self.experts, self.top_k
        if self.fused_moe is not None:  # the measured FusedMoE layer includes top-k, permutes and combine
            return self.fused_moe.time(t, e, k, d), self.router.time(t, d)
        active = e * (1.0 - (1.0 - k / e) ** t)       # expected distinct experts hit by t tokens
        rows = t * k
        per_expert = rows / active
        # one grouped launch each for up and down, over `active` experts of `per_expert` rows
        mlp = self.up.grouped(per_expert, d, active) + self.down.grouped(per_expert, d, active)
        routing = self.router.time(t, d) + self.act.launches(2, d * 4.0 * rows * self.hidden)  # the permutes
        return mlp, routing
