"""Hand-made scenarios, one or two per difference found between servesim and vLLM's scheduler (issue 20
and since).

Recorded with vLLM's own traces beside the random ones (`benchmarks/vllm_conformance.py record`) and
replayed by tests/test_vllm_conformance.py, so each fix is pinned by what vLLM itself did.
"""
from __future__ import annotations


def _cfg(**changes) -> dict:
    """A roomy sync config with `changes`."""
    return dict(dict(block_size=16, num_gpu_blocks=64, max_model_len=256, max_num_seqs=8,
                     max_num_batched_tokens=256, enable_chunked_prefill=True, long_prefill_token_threshold=0,
                     enable_prefix_caching=True, scheduling="fcfs", async_scheduling=False), **changes)


def _req(i: int, arrival: float, prompt: list, output: list, max_tokens: int, **changes) -> dict:
    return dict(dict(id=f"r{i}", arrival=arrival, prompt=prompt, output=output, max_tokens=max_tokens,
                     ignore_eos=False, stop_token_ids=[], priority=0, abort=None, min_tokens=0, stop=[]),
                **changes)


def _toks(start: int, n: int) -> list[int]:
    """n ordinary token ids (3..39, never EOS=2), different for each start."""
    return [3 + (start + k) % 37 for k in range(n)]


def regression_cases() -> list[dict]:
    """[{"name": ..., "scenario": ...}] for the differences of issue 20, and the release differences
    found since."""
    cases = []
    # 1: r0 (least important) decodes first and needs a block when r1 has taken the last ones
    for async_ in (False, True):
        cases.append(dict(name=f"priority_self_preemption{'_async' if async_ else ''}", scenario=dict(
            config=_cfg(num_gpu_blocks=6, max_model_len=96, enable_prefix_caching=False,
                        scheduling="priority", async_scheduling=async_),
            requests=[_req(0, 0.015625, _toks(0, 31), _toks(5, 42), 40, ignore_eos=True, priority=5),
                      _req(1, 0.046875, _toks(100, 48), _toks(7, 10), 8, priority=0),
                      _req(2, 0.078125, _toks(200, 32), _toks(9, 10), 8, priority=1)])))
    cases.append(dict(name="lone_request_threshold", scenario=dict(
        config=_cfg(long_prefill_token_threshold=16),
        requests=[_req(0, 0.015625, _toks(0, 100), _toks(1, 6), 4),
                  _req(1, 3.046875, _toks(50, 60), _toks(2, 6), 4)])))
    cases.append(dict(name="same_step_prefix_sharing", scenario=dict(
        config=_cfg(block_size=4),
        requests=[_req(0, 0.015625, _toks(0, 104), _toks(1, 6), 3), _req(1, 0.015625, _toks(0, 104), _toks(2, 6), 3)])))
    # 4: r0 and r1 leave cached blocks and uncached tails; r2 evicts some; r3 repeats r0's prompt
    cases.append(dict(name="free_queue_order", scenario=dict(
        config=_cfg(block_size=4, num_gpu_blocks=12, max_model_len=32, max_num_seqs=1),
        requests=[_req(0, 0.015625, _toks(0, 10), [2, 2], 1), _req(1, 2.046875, _toks(40, 6), [2, 2], 1),
                  _req(2, 4.078125, _toks(80, 30), [2] * 4, 1), _req(3, 6.109375, _toks(0, 10), [2, 2], 1)])))
    for async_ in (False, True):
        cases.append(dict(name=f"eos_stop{'_async' if async_ else ''}", scenario=dict(
            config=_cfg(max_num_seqs=1, async_scheduling=async_),
            requests=[_req(0, 0.015625, _toks(0, 20), [5, 6, 2, 8, 9], 10), _req(1, 0.046875, _toks(30, 20), [5, 2], 10)])))
    cases.append(dict(name="abort_during_stopping_step", scenario=dict(
        config=_cfg(),
        requests=[_req(0, 0.015625, _toks(0, 20), [5, 6, 2, 8], 10, abort=2.5)])))
    cases.append(dict(name="prompt_of_max_model_len", scenario=dict(
        config=_cfg(max_model_len=64, num_gpu_blocks=8),
        requests=[_req(0, 0.015625, _toks(0, 64), [5, 6], 2), _req(1, 0.046875, _toks(0, 63), [5, 6], 2)])))
    cases.append(dict(name="null_block", scenario=dict(
        config=_cfg(block_size=4, num_gpu_blocks=5, max_model_len=16, enable_prefix_caching=False),
        requests=[_req(0, 0.015625, _toks(0, 8), _toks(3, 8), 6, ignore_eos=True),
                  _req(1, 0.046875, _toks(20, 8), _toks(4, 8), 6, ignore_eos=True)])))
    # r0 (least important, admitted first) is passed over in step 3, its in-flight step sampling its last
    # token; r1 needs a block none is free for, so r0 is the victim: 0.19.1 then skips r2 (an index)
    cases.append(dict(name="passed_over_priority_victim", scenario=dict(
        config=_cfg(block_size=4, num_gpu_blocks=7, max_model_len=16, enable_prefix_caching=False,
                    scheduling="priority", async_scheduling=True),
        requests=[_req(0, 0.015625, _toks(0, 8), _toks(5, 6), 3, ignore_eos=True, priority=5),
                  _req(1, 0.046875, _toks(100, 8), _toks(7, 10), 6, ignore_eos=True, priority=0),
                  _req(2, 0.078125, _toks(200, 2), _toks(9, 10), 6, ignore_eos=True, priority=1)])))
    return cases


def stop_rule_cases() -> list[dict]:
    """[{"name": ..., "scenario": ...}] for the stop rules (differences 6 and 9 of issue 20)."""
    cases = []
    # 6: 'cd' completes on the 4th output token (a=3, b=4, c=5, d=6); one seat, so r1 waits for the abort
    for async_ in (False, True):
        cases.append(dict(name=f"stop_string_frontend{'_async' if async_ else ''}", scenario=dict(
            config=_cfg(max_num_seqs=1, async_scheduling=async_),
            requests=[_req(0, 0.015625, _toks(0, 20), [3, 4, 5, 6, 8, 9, 10, 11], 10, stop=["cd"]),
                      _req(1, 0.046875, _toks(30, 20), [8, 9, 10], 3)])))
    # 9: max_tokens unset runs up to max_model_len
    cases.append(dict(name="max_tokens_none", scenario=dict(
        config=_cfg(max_model_len=64, num_gpu_blocks=8),
        requests=[_req(0, 0.015625, _toks(0, 58), _toks(1, 10), None, ignore_eos=True)])))
    # below min_tokens EOS and the stop token id cannot be sampled; stop strings need more than min_tokens
    cases.append(dict(name="min_tokens_floor", scenario=dict(
        config=_cfg(),
        requests=[_req(0, 0.015625, _toks(0, 20), [2, 7, 3, 2, 9], 10, min_tokens=3, stop_token_ids=[7]),
                  _req(1, 0.046875, _toks(30, 20), [4, 5, 6, 5, 6, 9], 10, min_tokens=2, stop=["b", "cd"])])))
    # a stop string on the max_tokens token: the client sees "stop", the engine has ended it by length
    cases.append(dict(name="stop_string_on_the_last_token", scenario=dict(
        config=_cfg(),
        requests=[_req(0, 0.015625, _toks(0, 20), [3, 4, 5, 6], 3, stop=["bc"])])))
    return cases


def hybrid_cases() -> list[dict]:
    """[{"name": ..., "scenario": ...}] for the differences found in hybrid models' KV groups."""
    return []
