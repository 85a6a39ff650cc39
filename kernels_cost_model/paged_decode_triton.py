"""Paged decode attention in Triton: each request's keys and values read in place through its block table.

This is how vLLM's decode kernels read the cache (FlashAttention's paged KV, vLLM's Triton backend):
no gather into a contiguous copy first. The torch backend times it on CUDA so that a measured decode
row moves the bytes a serving step moves. Layout as vLLM's FlashAttention backend keeps it:
`[num_blocks, block_size, num_kv_heads, head_dim]` for keys and for values, one query token per request.

Long contexts over few requests are split along the context (flash decoding): each split writes a
partial output with its running max and sum, and a second kernel combines them, as FlashAttention's
split-KV path does. Needs Triton (shipped with PyTorch on CUDA); `TRITON_INTERPRET=1` runs it on a CPU.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

BLOCK_N = 64
"""Keys per tile (four 16-token cache blocks)."""
MAX_SPLITS = 64


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, part_ptr, stats_ptr, out_ptr,
                  scale, table_stride, tokens_per_split, splits,
                  H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BS: tl.constexpr, FINAL: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    start = s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    head = kvh * G + rows
    row_ok = rows < G
    q = tl.load(q_ptr + (b * H + head)[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for t0 in range(start, end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        ok = toks < end
        block = tl.load(table_ptr + b * table_stride + toks // BS, mask=ok, other=0)
        slot = block.to(tl.int64) * BS + toks % BS
        offs = (slot * KVH + kvh)[:, None] * D + dims[None, :]
        k = tl.load(k_ptr + offs, mask=ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if FINAL:
        out = acc / l_i[:, None]
        tl.store(out_ptr + (b * H + head)[:, None] * D + dims[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
    else:
        part = (b * H + head) * splits + s
        tl.store(part_ptr + part[:, None] * D + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(stats_ptr + part * 2, m_i, mask=row_ok)
        tl.store(stats_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _combine_kernel(part_ptr, stats_ptr, out_ptr, splits, D: tl.constexpr, SP: tl.constexpr):
    r = tl.program_id(0)
    idx = tl.arange(0, SP)
    ok = idx < splits
    m = tl.load(stats_ptr + (r * splits + idx) * 2, mask=ok, other=float("-inf"))
    l_s = tl.load(stats_ptr + (r * splits + idx) * 2 + 1, mask=ok, other=0.0)
    weight = tl.exp(m - tl.max(m, 0))
    dims = tl.arange(0, D)
    part = tl.load(part_ptr + (r * splits + idx)[:, None] * D + dims[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight * l_s, 0)
    tl.store(out_ptr + r * D + dims, out.to(out_ptr.dtype.element_ty))


def num_splits(batch: int, num_kv_heads: int, max_len: int, sms: int) -> int:
    """Splits along the context: enough programs for two per SM, each with at least two tiles of keys."""
    wanted = math.ceil(2 * sms / max(1, batch * num_kv_heads))
    most = max(1, math.ceil(max_len / (2 * BLOCK_N)))
    return max(1, min(wanted, most, MAX_SPLITS))


class PagedDecode:
    """One decode step's attention over a paged cache, its scratch buffers allocated once (graph-safe)."""

    def __init__(self, torch, q, k_cache, v_cache, block_table, seq_lens, max_len: int, sms: int):
        self.q, self.k, self.v = q, k_cache, v_cache
        self.table, self.lens = block_table, seq_lens
        batch, heads, dim = q.shape
        self.kv_heads = k_cache.shape[2]
        self.block_size = k_cache.shape[1]
        self.splits = num_splits(batch, self.kv_heads, max_len, sms)
        per_split = math.ceil(max_len / self.splits)
        self.tokens_per_split = math.ceil(per_split / BLOCK_N) * BLOCK_N
        self.out = torch.empty_like(q)
        rows = batch * heads * self.splits
        self.part = torch.empty(rows, dim, device=q.device, dtype=torch.float32)
        self.stats = torch.empty(rows, 2, device=q.device, dtype=torch.float32)
        group = heads // self.kv_heads
        self.group, self.block_m = group, max(16, triton.next_power_of_2(group))

    def __call__(self):
        batch, heads, dim = self.q.shape
        final = self.splits == 1
        _split_kernel[(batch, self.kv_heads, self.splits)](
            self.q, self.k, self.v, self.table, self.lens, self.part, self.stats, self.out,
            1.0 / math.sqrt(dim), self.table.stride(0), self.tokens_per_split, self.splits,
            H=heads, KVH=self.kv_heads, D=dim, G=self.group, BLOCK_M=self.block_m, BLOCK_N=BLOCK_N,
            BS=self.block_size, FINAL=final)
        if not final:
            _combine_kernel[(batch * heads,)](self.part, self.stats, self.out, self.splits, D=dim,
                                              SP=triton.next_power_of_2(self.splits))
        return self.out
