"""Speculative-decoding metrics, as vLLM's serving benchmark reports them.

From the per-step counters the spec-decode hook records (`num_drafts`, `num_draft_tokens`,
`num_accepted_tokens`, `num_accepted_pos_<i>`):
- acceptance rate = accepted draft tokens / draft tokens;
- mean acceptance length = 1 + accepted draft tokens / drafts (tokens per verification, bonus
  token included);
- per-position acceptance rate i = verifications that accepted draft i / drafts;
- tokens per step = output tokens emitted / engine steps that verified drafts or sampled.
"""
from __future__ import annotations

import pandas as pd


def has_spec_columns(steps: pd.DataFrame) -> bool:
    return "num_draft_tokens" in steps.columns


def spec_decode_summary(steps: pd.DataFrame, num_output_tokens: float) -> dict[str, float]:
    """The spec-decoding keys of a run's summary (empty when speculative decoding was off)."""
    if not has_spec_columns(steps):
        return {}
    drafts = float(steps["num_drafts"].sum())
    drafted = float(steps["num_draft_tokens"].sum())
    accepted = float(steps["num_accepted_tokens"].sum())
    sampling_steps = int((steps["num_sampled"] > 0).sum())
    nan = float("nan")
    out = {
        "spec_decode_num_drafts": int(drafts),
        "spec_decode_num_draft_tokens": int(drafted),
        "spec_decode_num_accepted_tokens": int(accepted),
        "spec_decode_acceptance_rate": accepted / drafted if drafted else nan,
        "spec_decode_acceptance_length": 1.0 + accepted / drafts if drafts else nan,
        "spec_decode_tokens_per_step": num_output_tokens / sampling_steps if sampling_steps else nan,
    }
    positions = sorted((c for c in steps.columns if c.startswith("num_accepted_pos_")),
                       key=lambda c: int(c.rsplit("_", 1)[1]))
    for column in positions:
        out[f"spec_decode_acceptance_rate_pos_{column.rsplit('_', 1)[1]}"] = (
            float(steps[column].sum()) / drafts if drafts else nan)
    return out


def format_spec_decode(summary: dict) -> list[str]:
    """Summary-table lines for speculative decoding (none when it was off)."""
    if "spec_decode_num_drafts" not in summary:
        return []
    s = summary
    positions = [v for k, v in s.items() if k.startswith("spec_decode_acceptance_rate_pos_")]
    per_pos = ", ".join(f"{100 * v:.1f}%" for v in positions)
    return [f"Spec decode  acceptance rate {100 * s['spec_decode_acceptance_rate']:.1f}%, "
            f"acceptance length {s['spec_decode_acceptance_length']:.2f}, "
            f"{s['spec_decode_tokens_per_step']:.2f} tokens/step; "
            f"{s['spec_decode_num_accepted_tokens']} of {s['spec_decode_num_draft_tokens']} drafted "
            f"tokens accepted in {s['spec_decode_num_drafts']} drafts; per position {per_pos}"]
