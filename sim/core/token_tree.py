"""Static draft trees (vLLM's `speculative_config.speculative_token_tree`).

A tree is a list of node paths: `(i,)` is the root's i-th ranked child (the drafter's i-th best
first token), `(i, j)` that node's j-th ranked child, and so on. As vLLM does, the paths are
sorted breadth first (by depth, then path), every node's parent must be in the tree, and
`num_speculative_tokens` equals the number of nodes: a request verifies 1 + nodes tokens a step
and accepts the nodes along one root path (at most the tree's depth). A chain of k drafts is the
tree `[(0,), (0, 0), ...]` of depth k.

A step that schedules only the first d nodes (the token budget or a length cap cut it) verifies
the subtree those d nodes form: breadth-first order keeps every parent before its children.

Presets:
- "eagle1": the 25-node, depth-5 tree EAGLE-1 verifies (Li et al., "EAGLE: Speculative Sampling
  Requires Rethinking Feature Uncertainty", arXiv 2401.15077; the `mc_sim_7b_63` choices of
  github.com/SafeAILab/EAGLE, eagle/model/choices.py): four first tokens, up to three children per
  node near the root, two at depth 5.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property

from kernels_cost_model.errors import ConfigError

FIELD = "speculative_config.speculative_token_tree"

PRESETS: dict[str, tuple[tuple[int, ...], ...]] = {
    "eagle1": ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
               (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
               (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1)),
}


@dataclass(frozen=True)
class TokenTree:
    """Node paths in breadth-first order."""

    nodes: tuple[tuple[int, ...], ...]

    @classmethod
    def parse(cls, value) -> "TokenTree":
        """From a preset name, vLLM's string form ("[(0,), (0, 0)]") or a list of paths."""
        if isinstance(value, TokenTree):
            return value
        if isinstance(value, str):
            value = PRESETS.get(value, value)
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ConfigError(FIELD, value, f"not a preset ({sorted(PRESETS)}) nor a list of "
                                                "paths like [(0,), (0, 0)]") from None
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(FIELD, value, "must be a non-empty list of paths like [(0,), (0, 0)]")
        nodes = [_path(p) for p in value]
        if len(set(nodes)) != len(nodes):
            raise ConfigError(FIELD, value, "lists a path twice")
        known = set(nodes)
        for node in nodes:
            if len(node) > 1 and node[:-1] not in known:
                raise ConfigError(FIELD, value, f"path {node} has no parent {node[:-1]} in the tree")
        return cls(tuple(sorted(nodes, key=lambda p: (len(p), p))))

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """depths[d]: the depth of the subtree of the first d nodes (d = 0..len)."""
        out, deepest = [0], 0
        for node in self.nodes:
            deepest = max(deepest, len(node))
            out.append(deepest)
        return tuple(out)

    @property
    def depth(self) -> int:
        return self.depths[-1]

    def level_widths(self, num_nodes: int) -> list[int]:
        """Nodes per depth (1, 2, ...) among the first `num_nodes`."""
        widths = [0] * self.depths[num_nodes]
        for node in self.nodes[:num_nodes]:
            widths[len(node) - 1] += 1
        return widths

    def nodes_within(self, max_depth: int) -> int:
        """The most leading nodes whose subtree is at most `max_depth` deep."""
        d = 0
        while d < len(self.nodes) and len(self.nodes[d]) <= max_depth:
            d += 1
        return d

    @cached_property
    def children(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        """Per node path (the root is ()), the ranks of its children, with their node index."""
        out: dict = {}
        for node in self.nodes:
            out.setdefault(node[:-1], []).append(node[-1])
        return {parent: tuple(sorted(ranks)) for parent, ranks in out.items()}

    def as_vllm_string(self) -> str:
        return str(list(self.nodes))


def chain(k: int) -> TokenTree:
    """The chain of k drafts as a tree."""
    return TokenTree(tuple((0,) * (i + 1) for i in range(k)))


def _path(p) -> tuple[int, ...]:
    if (not isinstance(p, (list, tuple)) or not p
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)):
        raise ConfigError(FIELD, p, "each path must be a non-empty list of child ranks >= 0")
    return tuple(p)
