"""SimPy processes around the engine: arrivals, client aborts and the engine loop.

One `simpy.Environment` per simulation. The engine loop sleeps on an event while there is no work
(never busy-waits); an arrival or abort wakes it. Each step lets its priced duration pass: as one
`timeout`, or, where no event is due before it ends, by moving the clock on itself (`_pass_time`: the same
time and the same order of events; a plain `simpy.Environment` only).
"""
from __future__ import annotations

import gc
import math
from collections.abc import Iterable
from contextlib import contextmanager

import simpy

from sim.core.config import MAX_NUM_GPU_BLOCKS, EngineConfig
from kernels_cost_model.errors import ConfigError, require
from sim.core.fields import is_int
from sim.engine.engine import Engine
from sim.engine.lazy_jump import jump
from sim.engine.lazy_rows import LazyStep
from sim.engine.leap import make_leaper
from sim.engine.livelock import HOLDERS_CAUSE, check_livelock
from sim.engine.leap_steady import ArrivalTimeout
from sim.core.invariants import InvariantError
from sim.core.records import RunRecords
from sim.core.text import check_token_text


class EngineProcess:
    """Wires an Engine into a SimPy environment and exposes `submit` for workloads."""

    def __init__(self, env: simpy.Environment, engine: Engine):
        self.env = env
        self.engine = engine
        self.wakeup: simpy.Event | None = None
        self.done_events: dict = {}
        engine.on_finish = self._on_finish
        engine.on_spin = self._on_spin
        self.leaper = (make_leaper(engine, env, (self.submit, self.enqueue)) if engine.config.mode == "fast"
                       else None)
        #: `_pass_time` reads SimPy's queue and sets its clock: an Environment of another kind (real time,
        #: a subclass that watches its events) gets a timeout for every step
        self.passes_time = type(env) is simpy.Environment
        self.process = env.process(self.loop())

    def submit(self, spec) -> simpy.Event:
        """Hand a request to the engine now; the event succeeds when it finishes."""
        done = self.env.event()
        req = self.enqueue(spec)
        if req.is_finished:
            done.succeed(req)
        else:
            self.done_events[req] = done
        return done

    def enqueue(self, spec):
        """Hand a request to the engine now, with no event for its end (open-loop arrivals wait on
        none: SimPy then has one event fewer to process per request). Returns the request."""
        req = self.engine.add_request(spec, self.env.now)
        if not req.is_finished:
            if spec.abort_time_s is not None:
                self.env.process(self._abort_at(req.request_id, spec.abort_time_s))
            self._wake()
        return req

    def _abort_at(self, request_id: str, when: float):
        yield self.env.timeout(max(0.0, when - self.env.now))
        self.engine.abort(request_id, self.env.now)
        self._wake()

    def _on_finish(self, req) -> None:
        done = self.done_events.pop(req, None)
        if done is not None:
            done.succeed(req)

    # ----- a spinning engine (sim.engine.livelock) -----------------------------------------
    #: the field its livelock error names (a disaggregated pool's instances name their pool's)
    blocks_field = "engine.num_gpu_blocks"

    def own_processes(self) -> set:
        """The SimPy processes that run this engine's steps."""
        return {self.process}

    def own_state(self) -> tuple:
        """What of the engine's future this process holds beyond the engine (nothing here)."""
        return ()

    def spin_cause(self) -> str:
        return HOLDERS_CAUSE

    def _on_spin(self) -> None:
        """The engine's requests came back at a preempt-only plan."""
        check_livelock(self.env, self, self.engine)

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def _pass_time(self, delay: float) -> bool:
        """Move SimPy's clock on by `delay` at once where no event is due by then (SimPy's queue holds
        none at or before `now + delay`): a timeout there would be the next event processed, resuming
        this loop alone at the same float time (`now + delay`, as `Environment.schedule` adds it), so
        its event's making, queueing and processing are saved (most steps under overload end before
        the next arrival). False where an event is due, or the environment is not a plain one
        (`passes_time`): the caller yields a timeout, which keeps SimPy's order of events at equal times."""
        if not self.passes_time:
            return False
        env = self.env
        queue = env._queue
        end = env._now + delay
        if queue and queue[0][0] <= end:
            return False
        env._now = end
        return True

    def loop(self):
        """The engine loop: plan a step, let its time pass, apply its results; sleep when idle.

        Under async scheduling (vLLM's default) the next step is planned when this one starts, before
        its tokens are known: step N+1 is scheduled after step N-1's results, as vLLM's batch queue
        of two does it.
        """
        env, engine = self.env, self.engine
        ahead = engine.config.is_async
        step = None
        while True:
            if ahead and step is not None and step.__class__ is LazyStep and self.passes_time:
                step = jump(engine.lazy_rows, step, env)  # (quiet turns of lazy rows run back to back)
            if self.leaper is not None and (step is None) != ahead:
                leapt = self.leaper.leap(step, env.now)
                if leapt is not None:
                    step, delays = leapt
                    for delay in delays:
                        if not self._pass_time(delay):
                            yield env.timeout(delay)
                    if self.leaper.tail is not None:
                        self.leaper.finish_tail(env.now)
                    continue
            if step is None:
                step = engine.plan_step(env.now) if engine.has_work else None
            if step is None:
                self.wakeup = env.event()
                yield self.wakeup
                self.wakeup = None
                continue
            following = None
            if ahead:  # (a leap may have planned it already, at the same time)
                following = self.leaper.take_planned() if self.leaper is not None else None
                if following is None and engine.has_work:
                    following = engine.plan_step(env.now)
            if step.duration > 0 and not self._pass_time(step.duration):
                yield env.timeout(step.duration)
            engine.finish_step(step, env.now, following)
            step = following


def check_until(until) -> None:
    """A run's `until`: None (run every request to the end) or a simulated time in seconds > 0."""
    require(until is None or ((is_int(until) or isinstance(until, float)) and until > 0), "until", until,
            "must be None (run to the end) or a number of simulated seconds > 0")


def run_env(env: simpy.Environment, until: float | None = None) -> None:
    """`env.run(until=until)` with Python's cyclic garbage collector paused (`collector_paused`)."""
    check_until(until)
    with collector_paused():
        env.run(until=until)


@contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector while a simulation runs; restore its state after.

    The engine makes no reference cycles (after a 10,000-request run with the collector off, a
    collection finds 43 objects), so reference counting frees all it drops, and the collector's
    passes over the young objects only evict the engine's data from the CPU caches: pausing it
    made issue 15's 10k runs under overload ~5 % faster (benchmarks/sim_speed.py, docs/performance.md).
    Only speed changes: a run's results do not depend on when cycles are collected. Garbage in
    cycles that a caller's hooks make waits for the collector's next pass after the run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def arrivals(env: simpy.Environment, specs: Iterable, submit):
    """Open-loop arrivals: submit each spec at its arrival time (specs sorted by arrival). Each
    waits on an `ArrivalTimeout` that knows the next spec's arrival (specs are read one ahead)."""
    specs = iter(specs)
    spec = next(specs, None)
    while spec is not None:
        following = next(specs, None)
        delay = spec.arrival_time_s - env.now
        if delay < 0:
            raise ConfigError(f"{spec.request_id or 'request'}.arrival_time_s", spec.arrival_time_s,
                              f"arrivals must be sorted (previous arrival at {env.now})")
        if delay > 0:
            yield ArrivalTimeout(env, delay, spec, submit,
                                 math.inf if following is None else following.arrival_time_s)
        submit(spec)
        spec = following


def check_traffic(workload, *, empty_ok: bool = False) -> None:
    """A run's `workload` (simulate()'s override, run_engine's traffic): a workload object (with
    `iter_requests` or `process`) or RequestSpecs (a list, non-empty unless `empty_ok`, or an iterable
    read as the run goes); anything else is named before the run starts. None passes (simulate(): the
    config's)."""
    from workloads.base import is_closed_loop
    from workloads.spec import RequestSpec
    if workload is None or is_closed_loop(workload) or hasattr(workload, "iter_requests"):
        return
    require(isinstance(workload, Iterable) and not isinstance(workload, (str, bytes, dict)), "workload", workload,
            "must be a workload object (with iter_requests or process) or a list of RequestSpec")
    if not isinstance(workload, (list, tuple)):
        return
    require(empty_ok or len(workload) > 0, "workload", workload, "has no requests; give at least one RequestSpec")
    bad = next((i for i, spec in enumerate(workload) if not isinstance(spec, RequestSpec)), None)
    if bad is not None:
        item = workload[bad]
        raise ConfigError(f"workload[{bad}]", item, f"must be a RequestSpec, not a {type(item).__name__}")
    late = next((i for i in range(1, len(workload)) if workload[i].arrival_time_s < workload[i - 1].arrival_time_s),
                None)
    if late is not None:
        before = workload[late - 1].arrival_time_s
        raise ConfigError(f"workload[{late}].arrival_time_s", workload[late].arrival_time_s,
                          f"arrivals must be sorted: workload[{late - 1}] arrives at {before}")
    _check_unique_ids(workload)


def check_progress(progress) -> None:
    """A run's `progress`: None or an object with `update(now)` (sim.api.progress.Progress)."""
    require(progress is None or callable(getattr(progress, "update", None)), "progress", progress,
            "must be an object with update(now), such as sim.api.progress.Progress")


def _check_unique_ids(specs: list) -> None:
    """Request ids given in a spec list name one request each (the results are keyed by them), and none
    is the id the engine gives a spec without one ("req-<its position>")."""
    first: dict = {}
    for i, spec in enumerate(specs):
        if spec.request_id is None:
            continue
        j = first.setdefault(spec.request_id, i)
        require(j == i, f"workload[{i}].request_id", spec.request_id, f"repeats workload[{j}]'s; ids must be unique")
    for i, spec in enumerate(specs):
        j = first.get(f"req-{i}") if spec.request_id is None else None
        require(j is None, f"workload[{i}].request_id", None, f"would be 'req-{i}', the id workload[{j}] gives;"
                " give every request an id, or none")


def start_workload(env: simpy.Environment, workload, submit, seed: int, enqueue=None) -> None:
    """Start the process feeding `workload` (a list of specs, open- or closed-loop) into `submit`
    (closed-loop clients wait on the event it returns); open-loop arrivals, which wait on nothing,
    use `enqueue` where given (`EngineProcess.enqueue`)."""
    from workloads.base import is_closed_loop
    from workloads.rng import make_rng
    rng = make_rng(seed, "workload")
    if is_closed_loop(workload):
        env.process(workload.process(env, submit, rng))
    elif hasattr(workload, "iter_requests"):
        env.process(arrivals(env, workload.iter_requests(rng), enqueue or submit))
    else:
        env.process(arrivals(env, workload, enqueue or submit))


def watch_finishes(env: simpy.Environment, engine: Engine, progress) -> None:
    """Call `progress.update(env.now)` after each request finishes (O(1) per request)."""
    inner = engine.on_finish

    def on_finish(req) -> None:
        if inner is not None:
            inner(req)
        progress.update(env.now)

    engine.on_finish = on_finish


def check_kv_capacity(num_gpu_blocks: int | None, config: EngineConfig) -> int:
    """The KV cache size in blocks, or a clear error if it cannot hold one max_model_len request."""
    if num_gpu_blocks is None:
        raise ConfigError("engine.num_gpu_blocks", None, "not set; give a number or size it from the GPU")
    require(is_int(num_gpu_blocks) and 1 <= num_gpu_blocks <= MAX_NUM_GPU_BLOCKS, "engine.num_gpu_blocks",
            num_gpu_blocks, f"must be an integer in [1, {MAX_NUM_GPU_BLOCKS}]")
    config = config.resolved()
    if num_gpu_blocks * config.block_size < config.max_model_len:
        raise ConfigError("engine.num_gpu_blocks", num_gpu_blocks,
                          f"KV cache holds {num_gpu_blocks * config.block_size} tokens, less than one "
                          f"max_model_len={config.max_model_len} request")
    return num_gpu_blocks


def check_outgrown(engine: Engine) -> None:
    """A named error where a request left unfinished has more tokens than the cache's usable blocks
    hold (`KVCacheManager.require_ever_fits`): one waiting for its whole sequence to fit never starts."""
    for req in sorted(engine.by_id.values(), key=lambda r: r.index):
        engine.state.kv.require_ever_fits(req, req.num_tokens)


def check_stalled(engine: Engine) -> None:
    """A named error where the engine ended with nothing running while its waiting head does not fit
    and waiting requests hold KV blocks (their prefix loaded from a CPU tier: vLLM's
    WAITING_FOR_REMOTE_KVS, then back in line behind a request preempted meanwhile). vLLM's
    first-come-first-served queue waits there for good: only the head is tried, and nothing running
    will free a block."""
    state, kv = engine.state, engine.state.kv
    held = [len(kv.blocks_of(req)) for req in state.waiting]
    if state.running or not any(held):
        return
    head = state.waiting[0]
    raise ConfigError("engine.num_gpu_blocks", kv.num_gpu_blocks,
                      f"the KV cache stalled: nothing runs and the waiting head {head.request_id} does not fit "
                      f"in the {kv.num_free_blocks} free blocks, while {sum(map(bool, held))} waiting request(s) "
                      f"hold {sum(held)} blocks their prefix was loaded into; vLLM's first-come-first-served "
                      "queue waits there for good. Give the GPU more KV blocks")


def check_all_finished(engines: list[Engine], until: float | None) -> None:
    """After a run to the end (`until` None): every request finished, else a named error where the
    cause is known (`check_outgrown`, `check_stalled`) or an InvariantError (a bug)."""
    unfinished = [e for e in engines if e.by_id]
    if until is not None or not unfinished:
        return
    for engine in unfinished:
        engine.settle()
        check_outgrown(engine)
        check_stalled(engine)
    stuck = sorted(rid for e in unfinished for rid in e.by_id)
    raise InvariantError(f"{len(stuck)} requests never finished (e.g. {stuck[:5]})")


def run_engine(workload, config: EngineConfig, cost_model, num_gpu_blocks: int | None = None, *,
               seed: int = 0, token_text=None, until: float | None = None, hooks=(),
               progress=None, kv_groups=None) -> RunRecords:
    """Simulate one engine replica serving `workload`; returns the run's records.

    `workload`: RequestSpecs sorted by arrival, an open-loop workload (`iter_requests`) or a
    closed-loop one (`process`). `num_gpu_blocks` defaults to the config's. `hooks`: engine hooks
    (`sim.core.hooks`; fresh objects per run, they keep state). `progress`: an object whose
    `update(now)` is called once per finished request (see sim.api.progress). `kv_groups`: the
    model's KV layer groups (kernels_cost_model.kv_layout); several select the hybrid KV manager.
    """
    check_until(until)
    require(workload is not None, "workload", workload, "give a workload object or a list of RequestSpec")
    check_traffic(workload, empty_ok=True)
    require(isinstance(config, EngineConfig), "config", config, "must be an EngineConfig")
    require(callable(getattr(cost_model, "step_time", None)), "cost_model", cost_model,
            "must be a cost model with step_time(batch), e.g. kernels_cost_model.make_cost_model(...)")
    check_progress(progress)
    check_token_text(token_text)
    config = config.resolved()
    blocks = check_kv_capacity(num_gpu_blocks if num_gpu_blocks is not None else config.num_gpu_blocks,
                               config)
    env = simpy.Environment()
    engine = Engine(config, cost_model, blocks, token_text=token_text, hooks=hooks, kv_groups=kv_groups)
    proc = EngineProcess(env, engine)
    if engine.keep_rows_lazy() and engine.is_async:
        proc.leaper = None  # (rows are lazy from one row on: quiet turns are jumped, never leapt)
    if progress is not None:
        watch_finishes(env, engine, progress)
    start_workload(env, workload, proc.submit, seed, proc.enqueue)
    run_env(env, until)
    check_all_finished([engine], until)
    if until is None and engine.state.kv.num_used_blocks:
        raise InvariantError(f"{engine.state.kv.num_used_blocks} KV blocks still held after every request finished")
    return engine.records(env.now)
