"""Data + expert parallelism for MoE models: DP ranks that step in lockstep and share their experts.

vLLM's DP + EP runs one engine per GPU (attention and dense layers data-parallel, TP 1) and spreads
the experts over the ranks. Every MoE layer exchanges tokens between ranks, so the ranks run each
forward pass together: an idle rank runs a dummy batch, and the step lasts as long as the slowest rank.

Per rank r with batch tokens T_r, T = sum of T_r, E experts (top-k), ep ranks:
- dense operators, attention, LM head, CPU: the base model's price of rank r's own batch;
- experts: the rank holds E/ep experts and computes T*k/ep routed rows over the
  (E/ep)(1-(1-k/E)^T) of them the batch touches (one grouped launch for up, one for down);
- token exchange: vLLM's default all-to-all ("allgather_reducescatter"): per MoE layer an all-gather
  of the hidden states and a reduce-scatter of the outputs, each moving (ep-1)/ep of T x hidden x 2 B
  on the bus: at the measured all-gather / reduce-scatter curves where this GPU has them for ep ranks
  (local size T x hidden x 2 B / ep), else with the all-reduce coefficients (latency + bus bytes / bw).
- padding: where every rank's batch fits a CUDA graph, vLLM pads all ranks to the largest rank's graph
  size (vllm/v1/worker/dp_utils.py), so T above is ep x that size and every rank's token-wise operators
  run at it; a batch past the largest capture size runs eagerly and nothing is padded (`dp_padding`).
A model beyond plain attention (layer_ops.ShapedCostModel: DeepSeek-V3, gpt-oss, ...) keeps its own
attention, leading dense layers and shared experts per rank; only its MoE layers' routed experts are
sharded and exchange tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import ConfigError, require

from .collectives import collective_curve
from .hardware import get_gpu
from .cost_model import RooflineCostModel

#: The batch an idle DP rank runs so the others' collectives can proceed (vLLM's dummy batch).
DUMMY_BATCH = BatchShape([1], [0], 0)


@dataclass(frozen=True)
class ExpertParallelCostModel:
    """Prices one lockstep step of `ep` DP ranks of a MoE model. `base` is the TP-1 model."""

    base: RooflineCostModel  # or a layer_ops.ShapedCostModel around one
    ep: int

    @property
    def _inner(self) -> RooflineCostModel:
        return getattr(self.base, "base", self.base)

    def __post_init__(self) -> None:
        require(self._inner.router is not None, "model", self.base.model.name, "expert parallelism needs a MoE model")
        require(isinstance(self.ep, int) and self.ep >= 1, "ep", self.ep, "must be an integer >= 1")

    def rank_breakdown(self, batch: BatchShape, total_tokens: int, pad_to: int = 0) -> dict[str, float]:
        """Seconds per operator family on one rank, given all ranks' tokens this step (`pad_to`: the
        tokens every rank's forward pass is padded to, `dp_padding`)."""
        terms = dict(self.base.breakdown(batch, pad_to))
        b = self._inner
        d = b.dtype_bytes
        shaped = self.base if b is not self.base else None
        L = shaped.moe_layers if shaped is not None else b.layers  # layers with routed experts
        e, k = b.experts, b.top_k
        t = max(total_tokens, 1)
        local = e / self.ep
        active = local * (1.0 - (1.0 - k / e) ** t)
        per_expert = t * k / self.ep / active
        if b.fused_moe is not None:  # the measured FusedMoE: this rank's experts, k/ep of them per token
            terms["mlp"] = L * b.fused_moe.time(t, local, k / self.ep, d)
        else:
            terms["mlp"] = L * (b.up.grouped(per_expert, d, active) + b.down.grouped(per_expert, d, active))
        if shaped is not None:  # this rank's own dense layers and shared experts (routed part left out)
            terms["mlp"] += shaped._mlp(batch, 0.0, pad_to)
        terms["all_to_all"] = (2.0 * L * b.collective_scale * self._exchange(t * b.hidden * d)
                               if self.ep > 1 else 0.0)
        return terms

    def _exchange(self, total_bytes: float) -> float:
        """One MoE layer's all-gather + reduce-scatter of `total_bytes` of hidden states over the ranks,
        at the measured curves where they exist (local size = total / ep), else latency + bus bytes / bw."""
        gpu, ep = self._inner.gpu.name, self.ep
        ag, rs = collective_curve(gpu, ep, "all_gather"), collective_curve(gpu, ep, "reduce_scatter")
        if ag is not None and rs is not None and self.base.gpu == get_gpu(gpu):  # the catalog's own host
            return 0.5 * (ag.time(total_bytes / ep) + rs.time(total_bytes / ep))
        c = self._inner.all_reduce
        return (ep - 1) / ep * total_bytes * c.s_per_byte + c.overhead_s

    def step_time(self, batches: list[BatchShape | None]) -> float:
        """Seconds of one lockstep step; None marks an idle rank (it runs the dummy batch)."""
        shapes = [x if x is not None else DUMMY_BATCH for x in batches]
        pad_to = self.dp_padding(shapes)
        total = pad_to * len(shapes) if pad_to > 0 else sum(x.total_new_tokens for x in shapes)
        return max(sum(self.rank_breakdown(x, total, pad_to).values()) for x in shapes)

    def dp_padding(self, shapes: list[BatchShape]) -> int:
        """The tokens every rank runs when vLLM pads the DP ranks alike: where every rank's batch fits a
        CUDA graph, all run the largest rank's padded size, and the MoE layers exchange that many tokens
        per rank (vllm/v1/worker/dp_utils.py `coordinate_batch_across_dp`: padding when the ranks'
        synced cudagraph mode, their minimum, is not NONE). Where one rank's batch fits no graph, every
        rank runs eagerly at its own tokens: -1 (0: an engine without graphs)."""
        b = self._inner
        sizes = b.cuda_graph_sizes
        if not sizes:
            return 0
        if any(x.total_new_tokens > sizes[-1] for x in shapes):
            return -1
        return max(b._padded(x.total_new_tokens) for x in shapes)


def expert_bytes(model) -> int:
    """Bytes of the routed experts' weights (gate, up and down projections of every expert in every MoE
    layer) at their stored precision (FP8, MXFP4 or the model's dtype)."""
    from .model_shapes import split_params
    from .models import get_model
    spec = get_model(model)
    per_weight = spec.expert_weight_bytes or spec.weight_bytes or spec.dtype_bytes
    return int(split_params(spec)[1] * per_weight)


def ep_kv_cache_blocks(model, gpu, ep: int, block_size: int = 16, gpu_memory_utilization: float = 0.9,
                       max_num_batched_tokens: int = 8192, kv_cache_dtype: str = "auto", *,
                       max_num_seqs: int = 256, cudagraph_memory_bytes: int = 0) -> int:
    """KV blocks per rank when each GPU holds only 1/ep of the experts (TP 1 per rank): the TP-1 budget
    plus the (ep-1)/ep of the experts' bytes a rank does not hold."""
    from .kv_memory import GIB, kv_bytes_per_token, kv_cache_memory_bytes, kv_layout, total_memory_bytes
    from .models import get_model
    spec = get_model(model)
    free = kv_cache_memory_bytes(spec, gpu, 1, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                                 cudagraph_memory_bytes)
    freed = expert_bytes(spec) * (ep - 1) // ep
    if free + freed <= 0:
        budget = total_memory_bytes(gpu) * gpu_memory_utilization
        raise ConfigError("gpu", gpu, f"{spec.name} with 1/{ep} of its experts per GPU needs "
                          f"{(budget - free - freed) / GIB:.1f} GiB but gpu_memory_utilization="
                          f"{gpu_memory_utilization} leaves {budget / GIB:.1f} GiB: no room for a KV cache")
    if spec.is_plain and kv_cache_dtype == "auto":
        block = block_size * kv_bytes_per_token(spec, 1)
        return int(max(free, 0) // block) + int((freed + min(free, 0)) // block)
    return int((free + freed) // kv_layout(spec, 1, block_size, kv_cache_dtype).block_bytes)
