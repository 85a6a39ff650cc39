"""Pipeline parallelism: one engine on TP x PP GPUs with up to PP batches in flight.

    from sim.planning.instances import simulate_pipeline
    from sim.planning.pipeline import PipelineConfig
    results = simulate_pipeline(config, PipelineConfig(pipeline_parallel_size=2, link="nvlink4"))

As vLLM V1 runs pipeline parallelism (a batch queue of PP batches): the scheduler plans a new batch
as soon as the first stage is free, from the requests not already in a batch in flight. A batch takes
its step time / PP per stage (the layers split evenly, see kernels_cost_model.pipeline), PP stages
plus PP-1 sends of its tokens' hidden states over the link; batches leave the last stage in order.
Its tokens are sampled and its stops applied when it leaves. TP ranks within a stage are priced by
the cost model as usual (TP x PP in one deployment). The batch queue takes the place of async
scheduling's one-step look-ahead, so the engine runs with `async_scheduling` off.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

import simpy

from kernels_cost_model.errors import require
from kernels_cost_model.links import get_link
from sim.api.simulator import SimulationConfig, within
from sim.core.invariants import InvariantError
from sim.engine.engine import Engine
from policies.vllm import VllmV1Policy
from sim.engine.livelock import HIDDEN_IN_FLIGHT_CAUSE, HOLDERS_CAUSE
from sim.engine.simulation import EngineProcess


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline stages and the link between consecutive stages."""

    pipeline_parallel_size: int = 2
    link: str = "nvlink4"

    def __post_init__(self) -> None:
        with within("pipeline"):
            get_link(self.link)


class PipelineProcess(EngineProcess):
    """EngineProcess whose loop keeps up to `stages` batches in flight."""

    def __init__(self, env: simpy.Environment, engine: Engine, stages: int, send_time):
        self.stages, self.send_time = stages, send_time
        self.in_flight: deque = deque()
        self.leaving: deque = deque()   # the processes that land the batches in flight, in order
        self.busy: set = set()
        self.last_exit = 0.0
        self.max_in_flight = 0
        self.sees_in_flight = isinstance(engine.policy, VllmV1Policy) and not any(
            getattr(hook, "keeps_in_flight_out_of_plans", False) for hook in engine.hooks)
        super().__init__(env, engine)

    def loop(self):
        env, engine = self.env, self.engine
        while True:
            step = self._plan() if len(self.in_flight) < self.stages and engine.has_work else None
            if step is None:
                self.wakeup = env.event()
                yield self.wakeup
                self.wakeup = None
                continue
            stage = step.duration / self.stages
            sends = (self.stages - 1) * self.send_time(sum(step.batch.num_new_tokens))
            exit_at = max(env.now + self.stages * stage + sends, self.last_exit + stage)
            delay = exit_at - env.now
            while env.now + delay < exit_at:  # (the timeout fires at now + delay: never before the last exit)
                delay = math.nextafter(delay, math.inf)
            self.last_exit = env.now + delay
            self.in_flight.append(step)
            self.busy.update(req for req, _ in step.plan.scheduled)
            self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
            self.leaving.append(env.process(self._leave(step, delay)))
            yield env.timeout(stage)   # the first stage takes the next batch

    def _plan(self):
        """Plan the next batch. vLLM V1's scheduler sees every running request: one whose tokens are all
        scheduled (a decode in flight) asks for none and is passed over, a prefill in flight gets its next
        chunk in this batch, and any may be preempted (its rows in flight then land stale). Other policies,
        and an engine whose hook keeps them out (a disaggregated prefill instance, `HandOff`), plan from
        the running requests not in flight (they rejoin in front, in order)."""
        state = self.engine.state
        if self.sees_in_flight:
            return self.engine.plan_step(self.env.now)
        hidden = [r for r in state.running if r in self.busy]
        if not hidden:
            return self.engine.plan_step(self.env.now)
        config = state.config
        if len(hidden) >= config.max_num_seqs:
            return None   # every seat is in flight
        state.running = [r for r in state.running if r not in self.busy]
        state.config = dataclasses.replace(config, max_num_seqs=config.max_num_seqs - len(hidden))  # seats taken
        try:
            return self.engine.plan_step(self.env.now)
        finally:
            state.running = hidden + state.running
            state.config = config

    def own_processes(self) -> set:
        return {self.process, *self.leaving}

    def own_state(self) -> tuple:
        """The batches in flight: each one's requests, in order."""
        return tuple(tuple(req.request_id for req, _ in step.plan.scheduled) for step in self.in_flight)

    def spin_cause(self) -> str:
        return HOLDERS_CAUSE if self.sees_in_flight else HIDDEN_IN_FLIGHT_CAUSE

    def _leave(self, step, delay: float):
        yield self.env.timeout(delay)
        if self.in_flight[0] is not step:
            raise InvariantError("pipeline batches left the last stage out of order")
        self.in_flight.popleft()
        self.leaving.popleft()
        self.busy.difference_update(req for req, _ in step.plan.scheduled)
        self.engine.finish_step(step, self.env.now)
        self._wake()


def check_no_speculation(config: SimulationConfig, pipeline_parallel_size: int) -> None:
    """Speculative decoding is not simulated under PP (the batch queue plans steps ahead of their drafts)."""
    spec = config.speculative_config
    require(spec is None or pipeline_parallel_size == 1, "speculative_config.method", spec and spec.method,
            f"not simulated with pipeline_parallel_size={pipeline_parallel_size}; drop one of the two")


def check_no_auto_length(config: SimulationConfig, pipeline_parallel_size: int) -> None:
    """max_model_len auto is fitted to an instance's cache without pipeline stages: not with PP > 1."""
    require(not config.auto_max_model_len or pipeline_parallel_size == 1, "engine.max_model_len", -1,
            "auto is fitted to the KV cache of an instance without pipeline stages; under pipeline "
            "parallelism give a number")
