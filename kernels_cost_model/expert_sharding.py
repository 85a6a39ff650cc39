"""Expert parallelism inside a tensor-parallel group (vLLM's `--enable-expert-parallel` at DP 1).

Without it vLLM splits every expert's intermediate width over the TP ranks. With it, each of the tp
ranks holds E/tp whole experts instead; attention stays tensor-parallel. At data-parallel size 1 the
MoE layer's input is already replicated on every rank (the attention's all-reduce), each rank runs its
own experts on the tokens routed to them, and the all-reduce that TP needs anyway combines the outputs:
no extra communication, the same weight bytes per GPU (so the same KV capacity), but different expert
GEMM shapes: full-width experts, E/tp of them, k/tp routed rows per token on average (balanced routing).
That is the shape AIConfigurator's FusedMoE tables time with `moe_ep_size` = tp. Lockstep DP + EP
ranks are expert_parallel.py.
"""
from __future__ import annotations

import dataclasses

from .operators import matmul_operator, moe_operator


def expert_sharded(model):
    """`model` (a RooflineCostModel of a MoE model at tp ranks) with experts sharded, not split."""
    spec, tp = model.model, model.tensor_parallel_size
    if not spec.is_moe or tp == 1:
        return model
    inter, h = float(spec.moe_intermediate_size), float(spec.hidden_size)
    experts, top_k = spec.num_experts / tp, spec.num_experts_per_tok / tp
    cal = model.calibration
    return dataclasses.replace(
        model, inter_gpu=inter, experts=experts, top_k=top_k,
        up=matmul_operator(cal, "mlp_up", h, 2 * inter), down=matmul_operator(cal, "mlp_down", inter, h),
        fused_moe=moe_operator(cal, h, inter, experts, top_k))
