"""Speculative decoding settings (vLLM's `speculative_config`) and the draft-length cap.

vLLM names: `method` ("eagle", "eagle3", "mtp", "draft_model", "ngram"), `model` (the draft model
or EAGLE head; required for "draft_model"), `num_speculative_tokens` (k drafts per step).
servesim's own keys say how drafts are accepted (see workloads.acceptance): `acceptance_dataset`
picks a measured preset, `acceptance_rates` overrides it with per-position rates.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

from kernels_cost_model.errors import ConfigError, require
from sim.core.request import Request
from sim.core.stop_rules import length_limit

SPEC_METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram")
#: Methods whose proposer writes the next drafts' KV during this step: vLLM reserves
#: `num_speculative_tokens` lookahead slots for them (scheduler `num_lookahead_tokens`).
LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How one engine speculates.

    method: the proposer ("eagle", "eagle3", "mtp", "draft_model", "ngram").
    model: draft model (catalog name) for "draft_model"; informational for EAGLE heads.
    num_speculative_tokens: drafts proposed per request per step (k >= 1).
    acceptance_dataset: which measured acceptance preset to use ("default": the method's own).
    acceptance_rates: per-position conditional acceptance probabilities (overrides the preset).
    ngram_fraction_of_step, draft_overhead_s: proposer-cost parameters (kernels_cost_model.speculative).
    """

    method: str = "eagle3"
    model: str | None = None
    num_speculative_tokens: int = 3
    acceptance_dataset: str = "default"
    acceptance_rates: tuple[float, ...] | None = None
    ngram_fraction_of_step: float | None = None
    draft_overhead_s: float | None = None

    def __post_init__(self) -> None:
        require(self.method in SPEC_METHODS, "speculative_config.method", self.method,
                f"must be one of {SPEC_METHODS}")
        k = self.num_speculative_tokens
        require(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 64,
                "speculative_config.num_speculative_tokens", k, "must be an integer in [1, 64]")
        require(self.method != "draft_model" or isinstance(self.model, str),
                "speculative_config.model", self.model, "method 'draft_model' needs a draft model name")
        if self.acceptance_rates is not None:
            rates = tuple(self.acceptance_rates)
            require(len(rates) >= 1 and all(isinstance(r, (int, float)) and 0 <= r <= 1 for r in rates),
                    "speculative_config.acceptance_rates", self.acceptance_rates,
                    "must be a non-empty list of probabilities in [0, 1]")
            object.__setattr__(self, "acceptance_rates", rates)
        for name in ("ngram_fraction_of_step", "draft_overhead_s"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, (int, float)) and 0 <= value < 1),
                    f"speculative_config.{name}", value, "must be null or a number in [0, 1)")

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens for the proposer (0 for n-gram)."""
        return self.num_speculative_tokens if self.method in LOOKAHEAD_METHODS else 0

    @classmethod
    def from_dict(cls, data: dict | None) -> "SpeculativeConfig | None":
        """From a TOML table or parsed JSON; unknown keys are named errors. None stays None."""
        if data is None or isinstance(data, SpeculativeConfig):
            return data
        if not isinstance(data, dict):
            raise ConfigError("speculative_config", data, "must be a table of settings")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"speculative_config.{key}", data[key],
                                  f"unknown setting; known: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "SpeculativeConfig":
        """Parse vLLM's `--speculative-config '{json}'` argument."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("speculative_config", text, f"not valid JSON: {exc}") from None
        return cls.from_dict(data)


def draft_limit(req: Request, num_speculative_tokens: int, max_model_len: int | None,
                in_flight: int = 0) -> int:
    """Drafts `req` may be given for its next step: at most k, and never more than it may still
    emit beyond the bonus token (`max_tokens`, and `max_model_len` on prompt + output, which also
    keeps every scheduled position below max_model_len as vLLM's scheduler does). `in_flight`:
    tokens steps still running may yet emit (async scheduling's placeholders), counted as emitted."""
    room = length_limit(req, max_model_len) - len(req.output_token_ids) - in_flight - 1
    return max(0, min(num_speculative_tokens, room))
