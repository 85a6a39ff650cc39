"""Run one engine process to the end of its workload and collect its Results (shared by the
offload and pipeline simulations, which wrap the engine in their own way)."""
from __future__ import annotations

from sim.api.results import Results
from sim.api.validation import warn_length_cuts, warn_rejections
from sim.engine.simulation import check_all_finished, run_env, start_workload


def serve(config, proc, workload, until: float | None, meta: dict) -> Results:
    """Feed config.workload (or `workload`) to `proc` (an EngineProcess), run, return Results."""
    engine, env, e = proc.engine, proc.env, config.engine
    traffic = workload if workload is not None else config.workload.build(e.eos_token_id, e.max_model_len)
    start_workload(env, traffic, proc.submit, config.seed)
    run_env(env, until)
    check_all_finished([engine], until)
    results = Results.from_records(engine.records(env.now), slo=config.slo.as_dict(), meta=meta)
    warn_rejections(results.requests, e.max_model_len, e.refuses_over_length)
    warn_length_cuts(results.requests, e.max_model_len)
    return results
