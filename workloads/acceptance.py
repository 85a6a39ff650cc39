"""How many draft tokens a verification step accepts: seeded per-position models and a script.

An acceptance model answers `num_accepted(request_index, position, num_drafts)`: of `num_drafts`
drafts verified for the request whose next output token is number `position` (0-based), how many
lead the bonus token (a prefix: draft i is accepted only if drafts 0..i-1 were). What the accepted
tokens are is not its business: under rejection sampling the output follows the target model's
distribution, so the engine takes them from the request's own token stream.

`PositionalAcceptance` draws each draft's fate from a hash of (seed, request, position, draft
slot): the same request at the same position accepts the same drafts whatever the schedule, so a
run is reproducible and two schedules differ only in timing. `ScriptedAcceptance` lets a test
dictate every step's count.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kernels_cost_model.errors import ConfigError, require

_MASK = (1 << 64) - 1

#: Per-position conditional acceptance rates (draft i accepted given drafts < i were), by (method,
#: dataset). "default" is the method's preset when no dataset is named.
#: - eagle3: Llama-3.1-8B-Instruct + EAGLE-3 on H100, vLLM v0.10; computed from the per-position
#:   accepted lengths published by SpecDecode-Bench (github.com/SpecDecode-Bench/simulator,
#:   data/llama3.1-8B/combined_{gsm8k,sharegpt}.jsonl, field acc_eagle) for a chain of k=3: gsm8k
#:   from its first three requests (570 positions, mean acceptance length 2.71), sharegpt from its
#:   first request (583 positions, 2.58).
#: - ngram: same source, field acc_ngram (gsm8k: first three requests, ~600 positions, length 1.43;
#:   sharegpt: first request, ~600 positions, 1.84, a code-heavy answer, so not the default).
#:   Approximate (runs of 1s transcribed by count, about +-5% on the first rate). The low first
#:   rate folds in the steps with no n-gram match.
#: - mtp: GLM-4.5-Air-106B with its one MTP head, GPQA-Main; unconditional per-position rates
#:   0.92, 0.68, 0.38 (SpecDecode-Bench, arXiv 2601.11580, section on reasoning workloads) turned
#:   into conditional ones (0.68/0.92, 0.38/0.68).
#: - eagle (EAGLE-1) and eagle3 on "mtbench": Llama-3.1-8B-Instruct with yuhuili/EAGLE-LLaMA3.1-
#:   Instruct-8B and EAGLE3-LLaMA3.1-Instruct-8B in vLLM V1, MT-Bench, batch 1: mean acceptance
#:   lengths for k = 2..7 in vLLM issue #20780 (github.com/vllm-project/vllm/issues/20780; EAGLE-1
#:   2.10, 2.29, 2.39, 2.43, 2.45, 2.47; EAGLE-3 2.36, 2.79, 3.08, 3.32, 3.46, 3.54). The step
#:   from k to k + 1 gives the unconditional rate of position k + 1; k = 2 only gives the sum of
#:   the first two, split assuming the second and third conditional rates are equal. The lengths
#:   carry two decimals, so deep rates are rough (EAGLE-1's seventh, 1.0, is dropped as noise;
#:   the sixth repeats). EAGLE-1's mtbench preset is its default.
#: No preset ships for "draft_model": pass `acceptance_rates`.
PRESETS: dict[tuple[str, str], tuple[float, ...]] = {
    ("eagle", "mtbench"): (0.728, 0.511, 0.511, 0.526, 0.400, 0.500),
    ("eagle", "default"): (0.728, 0.511, 0.511, 0.526, 0.400, 0.500),
    ("eagle3", "mtbench"): (0.781, 0.742, 0.742, 0.674, 0.828, 0.583, 0.571),
    ("eagle3", "gsm8k"): (0.765, 0.722, 0.705),
    ("eagle3", "sharegpt"): (0.724, 0.692, 0.699),
    ("eagle3", "default"): (0.724, 0.692, 0.699),
    ("ngram", "gsm8k"): (0.199, 0.678, 0.695),
    ("ngram", "sharegpt"): (0.343, 0.787, 0.828),
    ("ngram", "default"): (0.199, 0.678, 0.695),
    ("mtp", "gpqa"): (0.920, 0.739, 0.559),
    ("mtp", "default"): (0.920, 0.739, 0.559),
}


def preset_rates(method: str, dataset: str = "default") -> tuple[float, ...]:
    """The measured rates for `method` on `dataset`; a named error when none ships."""
    rates = PRESETS.get((method, dataset))
    if rates is None:
        known = sorted(d for m, d in PRESETS if m == method)
        reason = (f"no measured preset for method {method!r}; choose from {known}" if known else
                  f"no measured preset ships for method {method!r}; give acceptance_rates")
        raise ConfigError("speculative_config.acceptance_dataset", dataset, reason)
    return rates


def _uniform(seed: int, index: int, position: int, slot: int) -> float:
    """A uniform in [0, 1) from four integers (splitmix64 finaliser over a mixed key)."""
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9
         + position * 0x94D049BB133111EB + slot * 0x2545F4914F6CDD1D) & _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return (x >> 11) / (1 << 53)


@dataclass(frozen=True)
class PositionalAcceptance:
    """Draft slot i is accepted with probability rates[i] (the last rate repeats for deeper slots)
    given every earlier slot was, independently per (request, position)."""

    rates: tuple[float, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        require(len(self.rates) >= 1 and all(0 <= r <= 1 for r in self.rates), "acceptance_rates",
                self.rates, "must be a non-empty list of probabilities in [0, 1]")

    def num_accepted(self, request_index: int, position: int, num_drafts: int) -> int:
        rates, last = self.rates, len(self.rates) - 1
        for slot in range(num_drafts):
            if _uniform(self.seed, request_index, position, slot) >= rates[min(slot, last)]:
                return slot
        return num_drafts

    def accepted_on_tree(self, request_index: int, position: int, tree, num_nodes: int,
                         sibling_decay: float = 0.5) -> int:
        """Nodes accepted along the best root path of the first `num_nodes` nodes of `tree` (a
        sim.core.token_tree.TokenTree). At depth d one uniform decides which ranked child, if
        any, is the target's token: rank 0 with probability rates[d] (so a chain accepts exactly
        what `num_accepted` does), rank j with rates[d] * sibling_decay**j of what the ranks
        before it left. The walk stops when that child is not in the tree."""
        present = set(tree.nodes[:num_nodes])
        rates, last = self.rates, len(self.rates) - 1
        node: tuple[int, ...] = ()
        while True:
            depth = len(node)
            ranks = tree.children.get(node, ())
            u = _uniform(self.seed, request_index, position, depth)
            rate, covered, chosen = rates[min(depth, last)], 0.0, None
            for rank in range(ranks[-1] + 1 if ranks else 0):
                covered += (1.0 - covered) * rate * sibling_decay ** rank
                if u < covered:
                    chosen = rank
                    break
            if chosen is None or node + (chosen,) not in present:
                return depth
            node += (chosen,)

    def expected_length(self, num_drafts: int) -> float:
        """Mean tokens per verification (accepted drafts + the bonus token) with `num_drafts`."""
        total, alive = 1.0, 1.0
        for slot in range(num_drafts):
            alive *= self.rates[min(slot, len(self.rates) - 1)]
            total += alive
        return total


@dataclass
class ScriptedAcceptance:
    """A test's script: request index -> accepted counts, one per verification step, in order.

    A count above the drafts verified is clipped to them. When a request's script runs out (or it
    has none) `default(request_index, position, num_drafts)` answers; the default accepts nothing.
    """

    script: Mapping[int, Sequence[int]]
    default: Callable[[int, int, int], int] = field(default=lambda index, position, drafts: 0)
    _used: dict = field(default_factory=dict, init=False, repr=False)

    def num_accepted(self, request_index: int, position: int, num_drafts: int) -> int:
        counts = self.script.get(request_index, ())
        used = self._used.get(request_index, 0)
        self._used[request_index] = used + 1
        count = counts[used] if used < len(counts) else self.default(request_index, position, num_drafts)
        return max(0, min(count, num_drafts))


def accepted_on_tree(model, request_index: int, position: int, tree, num_nodes: int,
                     sibling_decay: float = 0.5) -> int:
    """Path length accepted on a draft tree by any acceptance model: a model without a tree rule
    (a test's script) answers as for a chain as deep as the subtree (any length up to it exists)."""
    if hasattr(model, "accepted_on_tree"):
        return model.accepted_on_tree(request_index, position, tree, num_nodes, sibling_decay)
    return model.num_accepted(request_index, position, tree.depths[num_nodes])


def make_acceptance(method: str, dataset: str = "default", rates: Sequence[float] | None = None,
                    seed: int = 0) -> PositionalAcceptance:
    """The acceptance model of a speculative config: explicit rates, else the measured preset."""
    return PositionalAcceptance(tuple(rates) if rates is not None else preset_rates(method, dataset),
                                seed)
