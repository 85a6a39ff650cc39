"""Validation of the config sections above the engine: deployment, workload, SLO and their cross-checks.

Each section's `__post_init__` calls its check here, so a bad value fails at construction with a
ConfigError naming the TOML path, the value and the reason, before anything is allocated or run.
"""
from __future__ import annotations

import dataclasses

from kernels_cost_model.errors import ConfigError, require
from sim.core.batch_defaults import DEFAULT_USAGE_CONTEXT, batch_defaults, with_batch_defaults
from sim.core.config import AUTO_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN
from sim.core.kv_groups import window_budget_tokens
from sim.core.fields import MAX_NUM_REQUESTS, MAX_SECONDS, at_least, check_types, in_range, is_int, one_of, positive

WORKLOAD_KINDS = ("poisson", "gamma", "trace", "closed_loop", "sessions")
MIN_RATE = 1e-6
"""Slowest arrival rate (req/s): slower ones push simulated times past ~1e9 s, where a float
clock no longer resolves microseconds and step durations would vanish in rounding."""
MAX_COLLECTIVE_SCALE = 100.0
"""Largest multiplier on measured collective times (hosts fitted so far need 1-3.5)."""

_COMMON = {"kind", "num_requests", "max_tokens", "ignore_eos"}
USED_BY_KIND = {
    "poisson": _COMMON | {"rate", "lengths", "shared_prefix_len"},
    "gamma": _COMMON | {"rate", "cv", "lengths", "shared_prefix_len"},
    "trace": _COMMON | {"path", "format", "target_rate"},
    "closed_loop": _COMMON | {"num_users", "lengths", "think_time_s"},
    "sessions": {"kind", "num_requests", "rate", "think_time_s"},
}
"""Workload settings each kind reads; setting another one is an error (it would be ignored)."""
WHY_UNUSED = {
    "rate": {"trace": "arrival times come from the trace (rescale them with target_rate)",
             "closed_loop": "each user sends its next request when the last one is answered (num_users, think_time_s)"},
    "cv": "only gamma arrivals have a coefficient of variation",
    "path": "only kind = 'trace' reads a file",
    "format": "only kind = 'trace' reads a file",
    "target_rate": "only kind = 'trace' rescales arrival times",
    "num_users": "only kind = 'closed_loop' has a fixed number of users",
    "think_time_s": "only closed_loop and sessions users think between requests",
    "lengths": "lengths come from the trace or the conversation script",
    "shared_prefix_len": "only poisson and gamma workloads prepend a shared prefix",
    "max_tokens": "a session's turns carry their own output lengths",
    "ignore_eos": "a session's turns end on their own EOS",
}


def check_deployment(d) -> None:
    """Types and ranges of a DeploymentConfig."""
    check_types(d, "deployment.")
    at_least("deployment.tensor_parallel_size", d.tensor_parallel_size, 1)
    at_least("deployment.data_parallel_size", d.data_parallel_size, 1)
    require(0 < d.gpu_memory_utilization <= 1, "deployment.gpu_memory_utilization",
            d.gpu_memory_utilization, "must be in (0, 1]")
    one_of("deployment.cost_model", d.cost_model, ("roofline", "linear"))
    require(0 < d.collective_scale <= MAX_COLLECTIVE_SCALE, "deployment.collective_scale", d.collective_scale,
            f"must be in (0, {MAX_COLLECTIVE_SCALE:g}] (a multiplier on measured collective times)")
    require(d.cpu_per_request_s is None or 0 <= d.cpu_per_request_s < 1, "deployment.cpu_per_request_s",
            d.cpu_per_request_s, "must be null or a number of seconds in [0, 1)")
    one_of("deployment.kv_cache_dtype", d.kv_cache_dtype, ("auto", "fp8"))
    in_range("deployment.cudagraph_memory_gib", d.cudagraph_memory_gib, 0, 1024, why="GiB per GPU")
    one_of("deployment.interconnect", d.interconnect, ("auto", "nvlink", "pcie"))
    one_of("deployment.clocks", d.clocks, ("sustained", "burst"))


def check_workload(w) -> None:
    """Types, ranges, and which settings the workload's kind uses (another one set is an error)."""
    check_types(w, "workload.")
    one_of("workload.kind", w.kind, WORKLOAD_KINDS)
    positive("workload.rate", w.rate)
    in_range("workload.rate", w.rate, MIN_RATE, 1e9, why="requests per second")
    in_range("workload.num_requests", w.num_requests, 1, MAX_NUM_REQUESTS)
    positive("workload.cv", w.cv, optional=True)
    positive("workload.target_rate", w.target_rate, optional=True)
    in_range("workload.target_rate", w.target_rate, MIN_RATE, 1e9, optional=True, why="requests per second")
    at_least("workload.num_users", w.num_users, 1, optional=True)
    in_range("workload.think_time_s", w.think_time_s, 0, MAX_SECONDS)
    at_least("workload.max_tokens", w.max_tokens, 1, optional=True)
    at_least("workload.shared_prefix_len", w.shared_prefix_len, 0)
    require(w.kind != "gamma" or w.cv is not None, "workload.cv", w.cv, "gamma arrivals need cv")
    require(w.kind != "trace" or w.path is not None, "workload.path", w.path, "trace needs a path")
    require(w.kind != "closed_loop" or w.num_users is not None, "workload.num_users",
            w.num_users, "closed_loop needs num_users")
    for f in dataclasses.fields(w):
        value = getattr(w, f.name)
        if f.name not in USED_BY_KIND[w.kind] and value != f.default:
            why = WHY_UNUSED[f.name]
            why = why[w.kind] if isinstance(why, dict) else why
            raise ConfigError(f"workload.{f.name}", value, f"not used by kind = {w.kind!r}: {why}")


def switch_kind(workload, updates: dict) -> dict:
    """The workload's settings with `updates` applied; a change of kind drops the old kind's own
    settings (back to their defaults) unless `updates` sets them again."""
    values = {f.name: getattr(workload, f.name) for f in dataclasses.fields(workload)}
    kind = updates.get("kind", workload.kind)
    if kind != workload.kind and kind in USED_BY_KIND:
        for f in dataclasses.fields(workload):
            if f.name not in USED_BY_KIND[kind]:
                values[f.name] = f.default
    return {**values, **updates}


def check_slo(slo) -> None:
    """SLO targets are positive durations or unset."""
    check_types(slo, "slo.")
    for name, value in vars(slo).items():
        if value is not None:
            require(0 < value <= MAX_SECONDS, f"slo.{name}", value, f"must be a duration in (0, {MAX_SECONDS:g}] s")


def check_simulation(config) -> None:
    """The seed, and what one section implies for another."""
    require(is_int(config.seed) and config.seed >= 0, "seed", config.seed, "must be an integer >= 0")
    engine, workload = config.engine, config.workload
    require(engine.max_model_len is None or workload.shared_prefix_len <= engine.max_model_len,
            "workload.shared_prefix_len", workload.shared_prefix_len,
            f"must not exceed engine.max_model_len={engine.max_model_len}"
            " (a longer prompt is rejected)")
    require(workload.max_tokens is None or engine.max_model_len is None or not engine.refuses_over_length
            or workload.max_tokens < engine.max_model_len, "workload.max_tokens", workload.max_tokens,
            f"must be below engine.max_model_len={engine.max_model_len}: vllm serve refuses a request whose prompt"
            " + max_tokens exceeds it, so it would refuse every request (engine.usage_context llm_class cuts the"
            " outputs there instead)")


def _model_unused(d, e) -> bool:
    return d.cost_model == "linear" and e.num_gpu_blocks is not None


def resolve_engine(engine, deployment):
    """The engine with its max_model_len (the model's maximum when unset, else checked against it, as
    vLLM) and, where unset, vLLM's step budget and batch size for the deployment's GPU and the engine's
    usage context (sim.core.batch_defaults). An unknown model or GPU is left for simulate() to name."""
    from kernels_cost_model import get_model
    from kernels_cost_model.max_model_len import resolve_max_model_len
    if engine.max_model_len == AUTO_MAX_MODEL_LEN:  # (the model's maximum first; SimulationConfig fits it,
        engine = dataclasses.replace(engine, max_model_len=None)  # within a pinned cache's tokens at once)
        if engine.num_gpu_blocks is not None:
            engine = _within_pinned_cache(engine, deployment)
    try:
        if not _model_unused(deployment, engine):
            try:
                spec = get_model(deployment.model)
            except ConfigError:
                return engine
            length = resolve_max_model_len(spec, engine.max_model_len)
            if length != engine.max_model_len:
                engine = dataclasses.replace(engine, max_model_len=length)
            engine = with_hybrid_block_size(engine, deployment)
        elif engine.max_model_len is None:
            engine = dataclasses.replace(engine, max_model_len=DEFAULT_MAX_MODEL_LEN)
        if engine.usage_context is None:
            engine = dataclasses.replace(engine, usage_context=DEFAULT_USAGE_CONTEXT)
        defaults = gpu_batch_defaults(engine, deployment.gpu)
        return engine if defaults is None else with_batch_defaults(engine, *defaults)
    except ConfigError as exc:
        raise ConfigError(_section_path(exc.field, deployment), exc.value, exc.reason) from None


def _section_path(field: str, deployment) -> str:
    """A field the engine's resolution named, by its TOML path: a deployment setting it read (the
    tensor parallel size the model's heads must divide, the KV cache dtype) under [deployment], the
    rest under [engine]."""
    if "." in field:
        return field
    deployment_fields = {f.name for f in dataclasses.fields(deployment)}
    return f"{'deployment' if field in deployment_fields else 'engine'}.{field}"


def with_hybrid_block_size(engine, deployment):
    """The engine at the block size vLLM runs the deployment's model at: for a model with
    linear-attention state layers, raised until one attention page holds one layer's state, even over a
    block_size the user set (vLLM logs it; servesim's summary header says so); else unchanged."""
    from kernels_cost_model.kv_memory import kv_block_size
    from sim.core.scheduler_profiles import get_scheduler_profile
    release = get_scheduler_profile(engine.scheduler_profile).release
    size = kv_block_size(deployment.model, deployment.tensor_parallel_size, engine.block_size,
                         deployment.kv_cache_dtype, release)
    return engine if size == engine.block_size else dataclasses.replace(engine, block_size=size)


def _within_pinned_cache(engine, deployment):
    """An auto max_model_len no longer than a pinned cache's tokens (or the model's maximum)."""
    from kernels_cost_model import get_model
    tokens = engine.num_gpu_blocks * engine.block_size
    try:
        limit = DEFAULT_MAX_MODEL_LEN if _model_unused(deployment, engine) else get_model(
            deployment.model).max_position_embeddings
    except ConfigError:
        return engine
    return dataclasses.replace(engine, max_model_len=min(tokens, limit))


def gpu_batch_defaults(engine, gpu) -> tuple[int, int] | None:
    """vLLM's (max_num_batched_tokens, max_num_seqs) defaults for the engine's usage context and vLLM
    release (its scheduler profile) on `gpu` (a name, a spec file or a GPU; None for one the catalog does
    not know: simulate() names it)."""
    from sim.core.scheduler_profiles import get_scheduler_profile
    from kernels_cost_model.hardware import get_gpu
    from kernels_cost_model.kv_memory import total_memory_bytes
    try:
        gpu = get_gpu(gpu)
    except ConfigError:
        return None
    return batch_defaults(engine.usage_context or DEFAULT_USAGE_CONTEXT, total_memory_bytes(gpu), gpu.name,
                          get_scheduler_profile(engine.scheduler_profile).release, gpu.compute_capability)


def unresolved_engine_values(config) -> dict:
    """The engine's settings with the derived ones (the model's max_model_len, vLLM's default step
    budget and batch size for the GPU) unset again, so a replaced model, GPU or setting derives them
    anew."""
    from kernels_cost_model.max_model_len import model_max_len
    e = config.engine
    values = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
    try:
        if not _model_unused(config.deployment, e) and e.max_model_len == model_max_len(config.deployment.model):
            values["max_model_len"] = None
    except ConfigError:
        pass
    if config.auto_max_model_len:
        values["max_model_len"] = AUTO_MAX_MODEL_LEN
    values["block_size"] = config.given_block_size
    defaults = gpu_batch_defaults(e, config.deployment.gpu)
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        unset = dataclasses.replace(e, **{name: None})
        derived = unset.resolved() if defaults is None else with_batch_defaults(unset, *defaults)
        if getattr(e, name) == getattr(derived, name):
            values[name] = None
    return values


def check_kv_holds_one_request(engine, deployment, num_gpu_blocks: int, layout=None) -> None:
    """vLLM refuses to start when the KV cache (sized, or pinned by `engine.num_gpu_blocks`) cannot hold
    one max_model_len request (per layer group, as its hybrid manager budgets one, when `layout` is
    given)."""
    tokens = layout.tokens(num_gpu_blocks) if layout is not None else num_gpu_blocks * engine.block_size
    fits = (layout.vllm_max_concurrency(num_gpu_blocks, engine.max_model_len, window_budget_tokens(engine)) >= 1
            if layout is not None else tokens >= engine.max_model_len)
    if engine.num_gpu_blocks is not None:
        require(fits, "engine.num_gpu_blocks", num_gpu_blocks,
                f"{num_gpu_blocks} blocks hold {tokens} KV tokens of {deployment.model} (per layer group), less than"
                f" one request of max_model_len={engine.max_model_len}: raise num_gpu_blocks or lower max_model_len")
    require(fits, "engine.max_model_len", engine.max_model_len,
            f"one request of this length needs {engine.max_model_len} KV tokens, more than the {tokens} the KV"
            f" cache holds ({deployment.model} on {deployment.gpu}, tensor_parallel_size="
            f"{deployment.tensor_parallel_size}, gpu_memory_utilization={deployment.gpu_memory_utilization});"
            f" the longest that fits is {tokens}:"
            " lower engine.max_model_len (auto, -1, fits it) or raise deployment.gpu_memory_utilization or"
            " tensor_parallel_size")


def check_step_budget(engine) -> None:
    """A step budget of at least one token per batched request (vLLM's SchedulerConfig refuses less).
    Checked where users configure a run (simulate, servesim run/disagg), not on bare engines, whose
    tests drive budgets below max_num_seqs on purpose. An unresolved budget (None: an unknown model left
    max_model_len, which it defaults to, unset) is not compared: `check_model_limits` names the model."""
    if engine.max_num_batched_tokens is None:
        return
    require(engine.max_num_batched_tokens >= engine.max_num_seqs, "engine.max_num_batched_tokens",
            engine.max_num_batched_tokens, f"must be >= max_num_seqs={engine.max_num_seqs} (each running request"
            " needs a token of the step's budget; vLLM refuses to start otherwise): raise it or lower max_num_seqs")


def check_model_limits(config) -> None:
    """engine.max_model_len within the model's own context (max_position_embeddings), as vLLM checks."""
    from kernels_cost_model import get_model
    d, e = config.deployment, config.engine
    if d.cost_model == "linear" and e.num_gpu_blocks is not None:
        return  # the model is not used: the step time and KV size come from elsewhere
    try:
        spec = get_model(d.model)
    except ConfigError as exc:
        raise ConfigError("deployment.model", d.model, exc.reason) from None
    require(e.max_model_len <= spec.max_position_embeddings, "engine.max_model_len", e.max_model_len,
            f"exceeds {spec.name}'s maximum context of {spec.max_position_embeddings} tokens")


def warn_rejections(requests, max_model_len: int, refuses_over_length: bool = False) -> None:
    """A loud warning when requests were rejected: a prompt of max_model_len tokens or more (vLLM answers
    it with an error), or, behind `vllm serve`'s front end (`refuses_over_length`), a prompt + max_tokens
    above max_model_len."""
    import warnings
    rejected = int(requests["rejected"].sum()) if len(requests) else 0
    if rejected:
        why = (f"prompt + max_tokens above engine.max_model_len={max_model_len} (vllm serve refuses them; "
               "engine.usage_context llm_class cuts their output there instead)" if refuses_over_length
               else f"prompt longer than engine.max_model_len={max_model_len}")
        warnings.warn(f"{rejected} of {len(requests)} requests ({rejected / len(requests):.0%}) were rejected:"
                      f" {why}; their latencies are not in the summary", stacklevel=3)


def length_cuts(requests, max_model_len: int):
    """Which requests had their output cut at max_model_len (prompt + output), short of their
    max_tokens: a request that reached its max_tokens on the same token was not cut (tables saved
    before the max_tokens column count every output that ended there)."""
    full = requests["num_prompt_tokens"] + requests["num_output_tokens"] >= max_model_len
    cut = (requests["finish_reason"] == "length") & ~requests["rejected"].astype(bool) & full
    if "max_tokens" in requests:
        cut &= ~(requests["num_output_tokens"] >= requests["max_tokens"])  # (NaN: no max_tokens)
    return cut


def warn_length_cuts(requests, max_model_len: int) -> None:
    """A warning when outputs ended at max_model_len (prompt + output), short of what was asked."""
    import warnings
    if not len(requests):
        return
    cut = int(length_cuts(requests, max_model_len).sum())
    if cut:
        warnings.warn(f"{cut} of {len(requests)} requests ({cut / len(requests):.0%}) had their output cut at "
                      f"engine.max_model_len={max_model_len} (prompt + output tokens), short of their "
                      "max_tokens / output length", stacklevel=3)
