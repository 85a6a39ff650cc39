"""SimPy processes around the engine: arrivals, client aborts and the engine loop.

One `simpy.Environment` per simulation. The engine loop sleeps on an event while there is no work
(never busy-waits); an arrival or abort wakes it. Each step is one `timeout` of the priced duration.
"""
from __future__ import annotations

from collections.abc import Iterable

import simpy

from sim.config import EngineConfig
from sim.errors import ConfigError
from sim.engine import Engine
from sim.invariants import InvariantError
from sim.records import RunRecords


class EngineProcess:
    """Wires an Engine into a SimPy environment and exposes `submit` for workloads."""

    def __init__(self, env: simpy.Environment, engine: Engine):
        self.env = env
        self.engine = engine
        self.wakeup: simpy.Event | None = None
        self.done_events: dict = {}
        engine.on_finish = self._on_finish
        env.process(self.loop())

    def submit(self, spec) -> simpy.Event:
        """Hand a request to the engine now; the event succeeds when it finishes."""
        done = self.env.event()
        req = self.engine.add_request(spec, self.env.now)
        if req.is_finished:
            done.succeed(req)
        else:
            self.done_events[req] = done
            if spec.abort_time_s is not None:
                self.env.process(self._abort_at(req.request_id, spec.abort_time_s))
            self._wake()
        return done

    def _abort_at(self, request_id: str, when: float):
        yield self.env.timeout(max(0.0, when - self.env.now))
        self.engine.abort(request_id, self.env.now)
        self._wake()

    def _on_finish(self, req) -> None:
        done = self.done_events.pop(req, None)
        if done is not None:
            done.succeed(req)

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def loop(self):
        """The engine loop: plan a step, let its time pass, apply its results; sleep when idle."""
        env, engine = self.env, self.engine
        while True:
            step = engine.plan_step(env.now) if engine.has_work else None
            if step is None:
                self.wakeup = env.event()
                yield self.wakeup
                self.wakeup = None
                continue
            yield env.timeout(step.duration)
            engine.finish_step(step, env.now)


def arrivals(env: simpy.Environment, specs: Iterable, submit):
    """Open-loop arrivals: submit each spec at its arrival time (specs sorted by arrival)."""
    for spec in specs:
        delay = spec.arrival_time_s - env.now
        if delay < 0:
            raise ValueError(f"{spec.request_id or 'request'}.arrival_time_s={spec.arrival_time_s}: "
                             f"arrivals must be sorted (previous arrival at {env.now})")
        if delay > 0:
            yield env.timeout(delay)
        submit(spec)


def run_engine(specs: Iterable, config: EngineConfig, cost_model, num_gpu_blocks: int | None = None,
               *, token_text=None, until: float | None = None, closed_loop=None, rng=None) -> RunRecords:
    """Simulate one engine replica over open-loop `specs` (and/or a closed-loop workload).

    `closed_loop` is an object with `process(env, submit, rng)`; `num_gpu_blocks` defaults to the
    config's. Returns the run's records.
    """
    blocks = num_gpu_blocks if num_gpu_blocks is not None else config.num_gpu_blocks
    if blocks is None:
        raise ValueError("num_gpu_blocks: not set in the config and not given; size the KV cache first")
    if blocks * config.block_size < config.max_model_len:
        raise ConfigError("num_gpu_blocks", blocks,
                          f"KV cache holds {blocks * config.block_size} tokens, less than one "
                          f"max_model_len={config.max_model_len} request")
    env = simpy.Environment()
    engine = Engine(config, cost_model, blocks, token_text=token_text)
    proc = EngineProcess(env, engine)
    env.process(arrivals(env, specs, proc.submit))
    if closed_loop is not None:
        env.process(closed_loop.process(env, proc.submit, rng))
    env.run(until=until)
    if until is None and engine.by_id:
        stuck = sorted(engine.by_id)[:5]
        raise InvariantError(f"{len(engine.by_id)} requests never finished (e.g. {stuck})")
    return engine.records(env.now)
