"""servesim's sized num_gpu_blocks against any the real vLLM runs record (sim/fidelity/kv_check.py)."""
import json

import pytest

from sim.fidelity.kv_check import kv_sizing_error, sized_gpu_blocks
from sim.fidelity.real_runs import (DEFAULT_ROOT, blocks_from_log, blocks_from_meta, find_runs, read_run,
                                    recorded_gpu_blocks)

RUNS = find_runs(DEFAULT_ROOT)
#: Largest |relative error| of the sized cache accepted against a recorded one (docs/fidelity.md).
TOLERANCE = 0.05


def test_log_lines_of_both_engines_give_blocks():
    v1 = "INFO [kv_cache_utils.py:1087] GPU KV cache size: 421,344 tokens\nMaximum concurrency ..."
    assert blocks_from_log(v1, 16) == 421_344 // 16
    assert blocks_from_log("INFO # GPU blocks: 27000, # CPU blocks: 2048", 16) == 27_000
    assert blocks_from_log("no sizing here", 16) is None


def test_meta_keys_and_folder_search(tmp_path):
    assert blocks_from_meta({"engine_kwargs": {"num_gpu_blocks_override": 900}}) == 900
    assert blocks_from_meta({"cache_config": {"num_gpu_blocks": 1200}}) == 1200
    assert blocks_from_meta({"engine_kwargs": {"max_num_seqs": 128}}) is None
    (tmp_path / "meta.json").write_text(json.dumps({"engine_kwargs": {}}))
    assert recorded_gpu_blocks(tmp_path) is None
    (tmp_path / "server.log").write_text("GPU KV cache size: 3,200 tokens\n")
    assert recorded_gpu_blocks(tmp_path, block_size=16) == 200


@pytest.mark.skipif(not RUNS, reason="../shared/data/real_vllm_runs not present")
@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_sized_blocks_against_recorded(run_dir):
    """The error is stated where a run records its num_gpu_blocks; the shared runs do not (their
    README), and then only servesim's own sizing is checked to be sane."""
    run = read_run(run_dir)
    sized = sized_gpu_blocks(run)
    assert sized > 0
    error = kv_sizing_error(run)
    if error is None:
        pytest.skip(f"{run_dir.name} records no num_gpu_blocks (servesim sizes {sized})")
    assert abs(error) <= TOLERANCE, f"{run_dir.name}: sized {sized}, error {100 * error:+.1f} %"
