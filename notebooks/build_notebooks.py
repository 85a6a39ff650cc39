"""Write the notebooks of this folder (outputs stripped) from the cell sources below.

    python notebooks/build_notebooks.py

Edit the cells here, re-run, commit the .ipynb files. CI executes them (tests/test_notebooks.py).
"""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent
SETUP = """\
%matplotlib inline
import pandas as pd
from sim import SimulationConfig, simulate
pd.set_option("display.precision", 2)"""

CAPACITY = [
    new_markdown_cell("""\
# Capacity what-ifs

What does chunked prefill buy, or a smaller `max_num_seqs`, and what happens at 2x load?
Each question is one `SimulationConfig.replace(...)` away from the default (Llama-3.1-8B on one H100,
vLLM policy with the batch settings `vllm serve` picks there, 1024 sequences and 8192-token steps,
ShareGPT-like Poisson traffic). Runs are seeded: the same config and seed give identical
numbers. Request counts are kept small so the notebook runs in seconds; raise `N` for tighter tails."""),
    new_code_cell(SETUP),
    new_code_cell("""\
N, RATE = 300, 8.0
base = SimulationConfig(seed=0).replace(workload={"rate": RATE, "num_requests": N},
                                        slo={"ttft_s": 0.5, "tpot_s": 0.05})
variants = {
    "vLLM defaults (chunked, 8192-token budget, 1024 seqs)": base,
    "chunked prefill, 2048-token budget": base.replace(engine={"max_num_batched_tokens": 2048}),
    "no chunked prefill": base.replace(engine={"enable_chunked_prefill": False}),
    "max_num_seqs 64": base.replace(engine={"max_num_seqs": 64}),
    "max_num_seqs 256 (an A100's default)": base.replace(engine={"max_num_seqs": 256}),
    "2x load": base.replace(workload={"rate": 2 * RATE, "num_requests": 2 * N}),
}
columns = ["median_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "request_throughput",
           "request_goodput", "slo_attainment", "num_preemptions", "kv_occupancy_peak"]
table = pd.DataFrame({name: simulate(config).summary for name, config in variants.items()}).T[columns]
table"""),
    new_markdown_cell("""\
How to read it: `request_goodput` counts requests per second that met both targets (TTFT <= 500 ms and
TPOT <= 50 ms); `slo_attainment` is their fraction. TPOT excludes the first token. A smaller token
budget bounds how long a decode waits behind a long prefill (compare `p99_itl_ms`) at the cost of
TTFT; `max_num_seqs` only matters once it binds; doubling the load past capacity turns the queue
into the dominant term of TTFT and starts preemptions when the KV cache fills."""),
    new_markdown_cell("## Latency against load\n\nA small sweep of the arrival rate, with and without chunked prefill."),
    new_code_cell("""\
from sim.plots import plot_throughput_latency

rows = []
for chunked in (True, False):
    for rate in (2.0, 4.0, 6.0, 8.0, 10.0):
        config = base.replace(workload={"rate": rate, "num_requests": 150},
                              engine={"enable_chunked_prefill": chunked})
        rows.append({"rate": rate, "chunked_prefill": chunked, **simulate(config).summary})
sweep = pd.DataFrame(rows)
plot_throughput_latency(sweep, x="rate", hue="chunked_prefill", slo={"p99_ttft_ms": 500, "p99_tpot_ms": 50})"""),
]

STOP = [
    new_markdown_cell("""\
# Stop conditions, tested with scripted token streams

`sim.run_until_stop` replays the engine's update stage over a scripted stream and reports what the
client sees: the output tokens and `finish_reason` ("stop", "length" or None if the stream ran out).
Which rule wins when two fire on the same token is a named *stop profile*."""),
    new_code_cell("""\
from hypothesis import given, settings
from sim import PROFILES, SamplingParams, SimulationConfig, run_until_stop, simulate

EOS = 2
print(sorted(PROFILES))"""),
    new_markdown_cell("""\
## The EOS-exactly-on-`max_tokens` tie

The third token is EOS and `max_tokens=3`. Current vLLM checks EOS before the length cap, so the
client sees `"stop"`; the V1 engine before October 2025 checked the cap first and reported `"length"`."""),
    new_code_cell("""\
for profile in ("vllm", "vllm-v1-2025"):
    result = run_until_stop([10, 11, EOS], EOS, SamplingParams(max_tokens=3), profile=profile)
    print(f"{profile:14s} finish_reason={result.finish_reason!r:9s} tokens={result.output_token_ids}")"""),
    new_markdown_cell("""\
## Properties over generated scenarios

`workloads.strategies.stop_scenarios()` plants EOS, a stop token id or a stop string at the
positions where the rules change their mind (`min_tokens`, `max_tokens`, the `max_model_len` cap).
Whatever the profile, a request never outputs more than `max_tokens`, and `"length"` means a cap bound.
Hypothesis runs derandomized here, so the notebook is deterministic."""),
    new_code_cell("""\
from workloads.strategies import stop_scenarios

checked = []

@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(stop_scenarios())
def caps_hold(scenario):
    for profile in ("vllm", "vllm-v1-2025"):
        r = run_until_stop(scenario.token_ids, scenario.eos_token_id, scenario.params,
                           prompt_len=scenario.prompt_len, max_model_len=scenario.max_model_len,
                           profile=profile)
        cap = scenario.params.max_tokens
        if scenario.max_model_len is not None:
            cap = min(cap, scenario.max_model_len - scenario.prompt_len)
        assert len(r.output_token_ids) <= cap
        if r.finish_reason == "length":
            assert len(r.output_token_ids) == cap
        checked.append(profile)

caps_hold()
print(f"{len(checked) // 2} scenarios checked under both profiles")"""),
    new_markdown_cell("""\
## The engine agrees with the replay

The same scripted stream through the full simulator (continuous batching, chunked prefill of a
long prompt) ends where `run_until_stop` says, under each profile."""),
    new_code_cell("""\
import numpy as np
from workloads import RequestSpec

for profile in ("vllm", "vllm-v1-2025"):
    params = SamplingParams(max_tokens=3)
    spec = RequestSpec(0.0, np.arange(3000), output_token_ids=(10, 11, EOS, 12), sampling_params=params)
    config = SimulationConfig().replace(engine={"stop_profile": profile, "eos_token_id": EOS,
                                                "max_num_batched_tokens": 1024})
    row = simulate(config, workload=[spec]).requests.iloc[0]
    replay = run_until_stop([10, 11, EOS, 12], EOS, params, profile=profile)
    print(f"{profile:14s} engine: {row.finish_reason!r} after {row.num_output_tokens} tokens; "
          f"replay: {replay.finish_reason!r}")
    assert row.finish_reason == replay.finish_reason"""),
    new_markdown_cell("""\
## Returning the last token's hidden state: which strategy is cheaper?

The hidden state comes out of the forward pass before the engine knows whether the token is the
last. Length stops are known in advance (`definite_last`); content stops (EOS, stop ids, stop strings)
are not (`speculative`). *Hybrid* extracts for every request that might stop this step and discards
the rest; *post-sampling prefill* recomputes each finished request's sequence in the next step.
Below, every request asks, on a length-bound workload (`ignore_eos`, fixed `max_tokens`) and an
EOS-heavy one (EOS at each request's natural length); small runs, so the figures are indicative."""),
    new_code_cell("""\
import pandas as pd
from sim.whatif import compare_strategies
from sim.core.config import EngineConfig
from kernels_cost_model import make_cost_model
from workloads import poisson_workload
from workloads.hidden_states import with_hidden_states

cost_model = make_cost_model("llama-3.1-8b", "h100")
engine = EngineConfig(num_gpu_blocks=20000)
traffic = {
    "length-bound": poisson_workload(4.0, 150, "sharegpt", max_tokens=128, ignore_eos=True),
    "EOS-heavy": poisson_workload(4.0, 150, "sharegpt", max_tokens=2048, ignore_eos=False),
}
tables = []
for name, workload in traffic.items():
    table = compare_strategies(with_hidden_states(workload, 1.0), engine, cost_model, seed=0).table().reset_index()
    tables.append(table.assign(workload=name))
pd.concat(tables)[["workload", "strategy", "step_time_pct", "peak_extra_mib", "mean_e2e_delta_s",
                   "p99_e2e_delta_s"]]"""),
    new_markdown_cell("""\
Hybrid adds a small extraction copy per step, even when most extracted rows are wasted (EOS-heavy
traffic makes every decode `speculative`); post-sampling prefill recomputes whole sequences and
delays each answer by a step. The crossover moves with hidden size, copy bandwidth and how long the
sequences are: rerun with your own `HiddenStatesCost` and traffic."""),
]

LATENCY = [
    new_markdown_cell("""\
# Latency distributions and KV-cache occupancy

One busy run of the default setup, seen through `sim.plots.run_plots`. Every plot function takes a `Results`
and returns a matplotlib Figure (`fig.savefig("x.png")` writes it; `servesim run --out DIR` writes
them all)."""),
    new_code_cell(SETUP + """
from sim import plots

results = simulate(SimulationConfig(seed=0).replace(workload={"rate": 12.0, "num_requests": 300}))
results.summary["p99_ttft_ms"], results.summary["num_preemptions"]"""),
    new_markdown_cell("TTFT, TPOT (first token excluded), inter-token latency and end-to-end latency, with p50 and p99 marked."),
    new_code_cell("plots.plot_latency_cdfs(results)"),
    new_markdown_cell("KV blocks in use over time; red crosses mark steps that preempted a request to free blocks."),
    new_code_cell("plots.plot_kv_occupancy(results)"),
    new_markdown_cell("What each step computed (prefill vs decode tokens), and how many requests ran and waited."),
    new_code_cell("plots.plot_batch_composition(results)"),
    new_markdown_cell("The per-step tables behind the plots are plain pandas DataFrames:"),
    new_code_cell("results.steps[[\"start_time\", \"duration\", \"num_prefill_tokens\", \"num_decode_tokens\", \"kv_occupancy\"]].describe()"),
]

NOTEBOOKS = {"capacity_what_if.ipynb": CAPACITY, "stop_conditions.ipynb": STOP,
             "latency_and_kv.ipynb": LATENCY}


def build() -> list[Path]:
    """Write every notebook with no outputs; returns their paths."""
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=cells, metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"}})
        for i, cell in enumerate(nb.cells):
            cell.id = f"{Path(name).stem}-{i}"  # stable ids: rebuilding gives identical files
        path = HERE / name
        nbformat.write(nb, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print(p)
