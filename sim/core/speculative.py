"""Speculative decoding settings (vLLM's `speculative_config`) and the draft-length cap.

vLLM names: `method` ("eagle", "eagle3", "mtp", "draft_model", "ngram"), `model` (the draft model
or EAGLE head; required for "draft_model"), `num_speculative_tokens` (k drafts per step).
servesim's own keys say how drafts are accepted (see workloads.acceptance): `acceptance_dataset`
picks a measured preset, `acceptance_rates` overrides it with per-position rates.
`speculative_token_tree` (vLLM's name) drafts a static tree instead of a chain (sim.core.token_tree).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

from kernels_cost_model.errors import ConfigError, require
from sim.core.request import Request
from sim.core.token_tree import TokenTree

SPEC_METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram")
#: Methods whose proposer writes the next drafts' KV during this step: vLLM reserves
#: `num_speculative_tokens` lookahead slots for them (scheduler `num_lookahead_tokens`).
LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
#: Methods vLLM's scheduler treats as EAGLE (`use_eagle`): the head reads the target's hidden states,
#: which shapes prefix caching (scheduler profiles' `eagle_*` fields).
EAGLE_METHODS = ("eagle", "eagle3", "mtp")
#: Methods that may draft a tree (vLLM's tree attention serves the EAGLE-style proposers).
TREE_METHODS = ("eagle", "eagle3", "mtp")
#: How requests sample (prices the rejection sampler; kernels_cost_model.speculative).
TARGET_SAMPLING = ("greedy", "random", "top_p")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How one engine speculates.

    method: the proposer ("eagle", "eagle3", "mtp", "draft_model", "ngram").
    model: draft model (catalog name) for "draft_model"; informational for EAGLE heads.
    num_speculative_tokens: drafts proposed per request per step (k >= 1).
    acceptance_dataset: which measured acceptance preset to use ("default": the method's own).
    acceptance_rates: per-position conditional acceptance probabilities (overrides the preset).
    ngram_fraction_of_step, draft_overhead_s: proposer-cost parameters (kernels_cost_model.speculative).
    speculative_token_tree: node paths of a static draft tree, vLLM's string form, or a preset
        ("eagle1"); num_speculative_tokens must equal its nodes (left out, it is set to them).
    tree_sibling_decay: how much less likely each lower-ranked sibling is to be the target's token
        (workloads.acceptance.PositionalAcceptance.accepted_on_tree).
    draft_vocab_size: the EAGLE-3 head's vocabulary (its config.json's; None: 32000, that of
        yuhuili/EAGLE3-LLaMA3.1-Instruct-8B); prices its LM head and the map to the target's.
    target_sampling: how requests sample, which sets the rejection sampler's cost: "greedy"
        (temperature 0), "random" (temperature only) or "top_p" (top-p / top-k: vLLM sorts every
        verified position's logits; vLLM's server applies the model's generation_config, top_p
        0.9 for Llama-3.1-Instruct).
    """

    method: str = "eagle3"
    model: str | None = None
    num_speculative_tokens: int = 3
    acceptance_dataset: str = "default"
    acceptance_rates: tuple[float, ...] | None = None
    ngram_fraction_of_step: float | None = None
    draft_overhead_s: float | None = None
    speculative_token_tree: tuple[tuple[int, ...], ...] | str | None = None
    tree_sibling_decay: float = 0.5
    draft_vocab_size: int | None = None
    target_sampling: str = "greedy"

    def __post_init__(self) -> None:
        require(self.method in SPEC_METHODS, "speculative_config.method", self.method,
                f"must be one of {SPEC_METHODS}")
        k = self.num_speculative_tokens
        require(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 64,
                "speculative_config.num_speculative_tokens", k, "must be an integer in [1, 64]")
        require(self.method != "draft_model" or isinstance(self.model, str),
                "speculative_config.model", self.model, "method 'draft_model' needs a draft model name")
        require(self.model is None or isinstance(self.model, str), "speculative_config.model", self.model,
                "must be a model name (a string) or null")
        if self.acceptance_rates is not None:
            rates = tuple(self.acceptance_rates) if isinstance(self.acceptance_rates, (list, tuple)) else ()
            require(len(rates) >= 1 and all(isinstance(r, (int, float)) and not isinstance(r, bool) and 0 <= r <= 1
                                            for r in rates),
                    "speculative_config.acceptance_rates", self.acceptance_rates,
                    "must be a non-empty list of probabilities in [0, 1]")
            object.__setattr__(self, "acceptance_rates", rates)
        for name in ("ngram_fraction_of_step", "draft_overhead_s"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, (int, float)) and 0 <= value < 1),
                    f"speculative_config.{name}", value, "must be null or a number in [0, 1)")
        require(self.target_sampling in TARGET_SAMPLING, "speculative_config.target_sampling",
                self.target_sampling, f"must be one of {TARGET_SAMPLING}")
        vocab = self.draft_vocab_size
        require(vocab is None or (isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 1),
                "speculative_config.draft_vocab_size", vocab, "must be null or an integer >= 1")
        require(vocab is None or self.method == "eagle3", "speculative_config.draft_vocab_size", vocab,
                f"applies to method 'eagle3' only (method is {self.method!r})")
        decay = self.tree_sibling_decay
        require(isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 <= decay <= 1,
                "speculative_config.tree_sibling_decay",
                decay, "must be a number in [0, 1]")
        if self.speculative_token_tree is not None:
            self._check_tree()

    def _check_tree(self) -> None:
        tree = TokenTree.parse(self.speculative_token_tree)
        require(self.method in TREE_METHODS, "speculative_config.method", self.method,
                f"a speculative_token_tree needs one of {TREE_METHODS}")
        require(self.num_speculative_tokens == len(tree), "speculative_config.num_speculative_tokens",
                self.num_speculative_tokens, f"must equal the {len(tree)} nodes of speculative_token_tree")
        object.__setattr__(self, "speculative_token_tree", tree.nodes)

    @property
    def tree(self) -> TokenTree | None:
        """The draft tree, or None for a chain."""
        nodes = self.speculative_token_tree
        return None if nodes is None else TokenTree(nodes)

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens for the proposer (0 for n-gram)."""
        return self.num_speculative_tokens if self.method in LOOKAHEAD_METHODS else 0

    @classmethod
    def from_dict(cls, data: dict | None) -> "SpeculativeConfig | None":
        """From a TOML table or parsed JSON; unknown keys and a missing method are named errors. None stays None."""
        if data is None or isinstance(data, SpeculativeConfig):
            return data
        if not isinstance(data, dict):
            raise ConfigError("speculative_config", data, "must be a table of settings")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(f"speculative_config.{key}", data[key],
                                  f"unknown setting; known: {sorted(known)}")
        require("method" in data, "speculative_config.method", None, f"give a method, one of {SPEC_METHODS}")
        tree = data.get("speculative_token_tree")
        if tree is not None and "num_speculative_tokens" not in data:
            data = {**data, "num_speculative_tokens": len(TokenTree.parse(tree))}
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
                in_flight: int = 0, tree: TokenTree | None = None) -> int:
    """Drafts `req` may be given for its next step: k, fewer only where a scheduled position would
    reach `max_model_len` (vLLM's scheduler caps a row at max_model_len - 1 - computed). Not capped at
    `max_tokens`: vLLM 0.19.1 and 0.33.0 verify 1 + k tokens up to the last step and drop what passes
    max_tokens at the stop (a partial row would break its uniform decode batches). `in_flight`: tokens
    steps still running may yet emit (async scheduling's placeholders), counted as emitted. With a
    draft `tree`: its leading nodes whose subtree is at most `room` deep."""
    limit = max_model_len - req.num_prompt_tokens if max_model_len is not None else 1 << 62
    room = limit - len(req.output_token_ids) - in_flight - 1
    if tree is not None:
        return tree.nodes_within(max(0, room))
    return max(0, min(num_speculative_tokens, room))
