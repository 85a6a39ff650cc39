"""LinearCostModel: a simple, documented step-time model for tests and quick what-ifs.

step_time = fixed_s + per_new_token_s * (tokens computed) + per_context_token_s * (KV tokens read)
          + per_sampled_s * (requests sampling)

The defaults are a back-of-envelope Llama-3-8B on one H100 SXM (bf16):
- fixed_s 5.5 ms: reading 16 GB of weights at 3.35 TB/s (H100 SXM datasheet) plus ~0.7 ms launch
  and engine CPU time per step;
- per_new_token_s 30 us: 2 * 8e9 FLOP per token at ~55% of 989 TFLOP/s dense bf16 (datasheet);
- per_context_token_s 40 ns: 128 KiB of K+V per token (32 layers x 8 KV heads x 128 dims x 2 x 2 B)
  read at 3.35 TB/s;
- per_sampled_s 20 us: LM head row, sampling and output processing per sampled request.
The kernel cost model (kernels_cost_model) replaces it with a calibrated per-operator roofline.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import require


@dataclass(frozen=True)
class LinearCostModel:
    fixed_s: float = 5.5e-3
    per_new_token_s: float = 30e-6
    per_context_token_s: float = 40e-9
    per_sampled_s: float = 20e-6

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_new_token_s", "per_context_token_s", "per_sampled_s"):
            value = getattr(self, name)
            require(value >= 0, name, value, "must be >= 0")

    def step_time(self, batch: BatchShape) -> float:
        new = sum(batch.num_new_tokens)
        context = sum(batch.num_context_tokens) + new
        return (self.fixed_s + self.per_new_token_s * new + self.per_context_token_s * context
                + self.per_sampled_s * batch.num_sampled)

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        new = sum(batch.num_new_tokens)
        return {
            "fixed": self.fixed_s,
            "tokens": self.per_new_token_s * new,
            "kv_read": self.per_context_token_s * (sum(batch.num_context_tokens) + new),
            "sampling": self.per_sampled_s * batch.num_sampled,
        }
