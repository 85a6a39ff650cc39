"""Draft trees (vLLM's speculative_token_tree, issue 16): parsing, acceptance along one root path,
pricing of every node, and content invariance under sync and async scheduling."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cost_model.errors import ConfigError
from sim.core.config import EngineConfig
from sim.core.cost import LinearCostModel
from sim.core.sampling_params import SamplingParams
from sim.core.speculative import SpeculativeConfig
from sim.core.token_tree import PRESETS, TokenTree, chain
from sim.engine.engine import Engine
from sim.engine.spec_decode import SpecDecoder
from tests.engine_harness import EOS, drive, engine_configs, padded_budget
from tests.test_spec_decode_async import AsyncChecks, drive_async
from tests.test_spec_decode_properties import (PROFILES, TOKEN_TEXT, StepSizes, acceptance_scripts,
                                              assert_outputs_equal_run_until_stop, spec_requests)
from workloads.acceptance import PositionalAcceptance, ScriptedAcceptance
from workloads.spec import RequestSpec


# ----- the tree ---------------------------------------------------------------------------------
def test_eagle1_preset_and_vllm_string_form():
    tree = TokenTree.parse("eagle1")
    assert len(tree) == 25 and tree.depth == 5
    assert tree.level_widths(25) == [4, 8, 8, 3, 2]
    assert TokenTree.parse(tree.as_vllm_string()) == tree
    shuffled = TokenTree.parse("[(0, 0), (1,), (0,)]")
    assert shuffled.nodes == ((0,), (1,), (0, 0))  # breadth first, as vLLM sorts it
    assert shuffled.depths == (0, 1, 1, 2) and shuffled.nodes_within(1) == 2
    assert chain(3).nodes == ((0,), (0, 0), (0, 0, 0))


@pytest.mark.parametrize("data, field, words", [
    ({"method": "eagle", "speculative_token_tree": "[(0,), (1, 0)]"}, "speculative_token_tree", "parent"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (0,)]"}, "speculative_token_tree", "twice"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (-1,)]"}, "speculative_token_tree", "ranks"),
    ({"method": "eagle", "speculative_token_tree": "oak"}, "speculative_token_tree", "preset"),
    ({"method": "ngram", "speculative_token_tree": "eagle1"}, "method", "needs one of"),
    ({"method": "eagle", "num_speculative_tokens": 5, "speculative_token_tree": "eagle1"},
     "num_speculative_tokens", "25 nodes"),
])
def test_bad_trees_name_the_field(data, field, words):
    with pytest.raises(ConfigError, match=words) as err:
        SpeculativeConfig.from_dict(data)
    assert f"speculative_config.{field}" in str(err.value)


def test_tree_sets_the_draft_count_and_round_trips():
    config = SpeculativeConfig.from_dict({"method": "eagle", "speculative_token_tree": "eagle1"})
    assert config.num_speculative_tokens == 25 and config.tree == TokenTree.parse("eagle1")
    again = SpeculativeConfig.from_dict(dataclasses.asdict(config))
    assert again == config


# ----- acceptance along the best path -----------------------------------------------------------
def test_a_chain_shaped_tree_accepts_what_the_chain_does():
    model = PositionalAcceptance((0.8, 0.6, 0.5), seed=3)
    tree = chain(4)
    for i in range(200):
        for d in range(5):
            assert model.accepted_on_tree(i, 7, tree, d) == model.num_accepted(i, 7, d)


def test_a_wider_tree_accepts_more_and_never_past_its_depth():
    model = PositionalAcceptance((0.728, 0.511, 0.511, 0.526, 0.4), seed=1)
    tree, line = TokenTree.parse("eagle1"), chain(5)
    wide = [model.accepted_on_tree(i, p, tree, 25) for i in range(100) for p in range(20)]
    narrow = [model.accepted_on_tree(i, p, line, 5) for i in range(100) for p in range(20)]
    assert all(w >= n for w, n in zip(wide, narrow))  # the chain is a subtree: same draws
    assert np.mean(wide) > np.mean(narrow) + 0.1
    assert max(wide) <= 5
    assert all(model.accepted_on_tree(i, 0, tree, 4) <= 1 for i in range(200))  # 4 nodes: depth 1
    no_siblings = [model.accepted_on_tree(i, p, tree, 25, sibling_decay=0.0)
                   for i in range(100) for p in range(20)]
    assert no_siblings == narrow  # siblings never catch: only rank 0 matters


# ----- pricing ------------------------------------------------------------------------------------
def test_every_node_is_verified_and_priced():
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.batch import BatchShape
    from kernels_cost_model.speculative import verify_step_time
    cost = make_cost_model("llama-3.1-8b", "h100")
    times = [verify_step_time(cost, BatchShape([1 + n] * 64, [500] * 64, 64 * (1 + n)), [n] * 64)
             for n in (5, 25)]
    assert times[1] > times[0]


def test_tree_run_verifies_all_nodes_and_accepts_one_path():
    from sim.api.simulator import SimulationConfig, simulate
    base = SimulationConfig().replace(workload={"num_requests": 6, "rate": 0.5, "max_tokens": 64})
    line = simulate(base.replace(speculative_config={"method": "eagle", "num_speculative_tokens": 5}))
    tree = simulate(base.replace(speculative_config={"method": "eagle", "speculative_token_tree": "eagle1"}))
    s = tree.summary
    assert s["spec_decode_num_draft_tokens"] / s["spec_decode_num_drafts"] > 20  # nodes per verification
    assert s["spec_decode_acceptance_length"] > line.summary["spec_decode_acceptance_length"]
    assert "spec_decode_acceptance_rate_pos_5" in s and "spec_decode_acceptance_rate_pos_6" not in s
    assert tree.requests["num_output_tokens"].tolist() == line.requests["num_output_tokens"].tolist()


# ----- content invariance -------------------------------------------------------------------------
@st.composite
def trees(draw, max_nodes: int = 8):
    """Random valid trees: each new node hangs under the root or an existing node."""
    nodes: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(1, max_nodes))):
        parent = draw(st.sampled_from([()] + nodes))
        rank = sum(1 for n in nodes if n[:-1] == parent)
        nodes.append(parent + (rank,))
    return TokenTree.parse(nodes)


configs = st.sampled_from([56, 96]).flatmap(lambda m: engine_configs(max_model_len=m))


@given(spec_requests(), configs, acceptance_scripts(), trees(), st.sampled_from(PROFILES), st.booleans(),
       st.booleans())
def test_tree_outputs_equal_run_until_stop(specs, config, script, tree, profile, async_, positional):
    config = padded_budget(dataclasses.replace(config, stop_profile=profile, async_scheduling=async_), len(tree))
    spec_config = SpeculativeConfig("eagle", num_speculative_tokens=len(tree), speculative_token_tree=tree.nodes)
    acceptance = PositionalAcceptance((0.9, 0.7), seed=len(specs)) if positional else script
    hooks = [SpecDecoder(spec_config, StepSizes(acceptance)), AsyncChecks(len(tree), len(tree))]
    engine = Engine(config, LinearCostModel(), config.num_gpu_blocks, token_text=TOKEN_TEXT, hooks=hooks)
    done = {}
    engine.on_finish = lambda req: done.__setitem__(req.request_id, req)
    (drive_async if async_ else drive)(engine, specs)
    assert_outputs_equal_run_until_stop(engine, done, specs, config, profile)
    accepted = engine.steps.extra["num_accepted_tokens"]
    assert max(accepted, default=0) <= tree.depth * config.max_num_seqs
    assert engine.state.kv.num_used_blocks == 0


def test_tree_stop_inside_the_accepted_path():
    config = EngineConfig(block_size=4, num_gpu_blocks=64, max_model_len=64, eos_token_id=EOS,
                          check_invariants=True, async_scheduling=False)
    spec_config = SpeculativeConfig.from_dict({"method": "eagle", "speculative_token_tree": "[(0,), (1,), (0, 0), (0, 0, 0)]"})
    engine = Engine(config, LinearCostModel(), 64, token_text=TOKEN_TEXT,
                    hooks=[SpecDecoder(spec_config, ScriptedAcceptance({}, default=lambda i, p, d: d))])
    done = []
    engine.on_finish = done.append
    spec = RequestSpec(0.0, np.arange(8, dtype=np.int32) + 100, output_token_ids=(5, 5, EOS, 5, 5),
                       sampling_params=SamplingParams(max_tokens=20), request_id="r")
    logs = drive(engine, [spec])
    assert done[0].output_token_ids == [5, 5, EOS]
    rows = [row for log in logs for row in log.rows]
    assert rows[1][2] == 5 and rows[1][4] == 2  # 1 + 4 nodes verified; EOS is the 2nd of 3 on the path
    assert PRESETS["eagle1"][0] == (0,)


def test_tree_drafting_costs_one_pass_per_depth_over_its_nodes():
    from kernels_cost_model import make_cost_model
    from kernels_cost_model.batch import BatchShape
    from kernels_cost_model.speculative import ProposerCost, drafter_spec
    head = make_cost_model(drafter_spec("eagle", "llama-3.1-8b"), "h100", cpu_overhead=False)
    batch = BatchShape([1] * 32, [800] * 32, 32)
    context = [801] * 32
    widths = tuple(TokenTree.parse("eagle1").level_widths(25))
    line = ProposerCost("eagle", 5, head)(batch, context, 0.01)
    as_tree = ProposerCost("eagle", 5, head, tree_widths=(1,) * 5)(batch, context, 0.01)
    wide = ProposerCost("eagle", 25, head, tree_widths=widths)(batch, context, 0.01)
    assert as_tree == pytest.approx(line)  # a chain is the tree of width 1
    assert wide > line
