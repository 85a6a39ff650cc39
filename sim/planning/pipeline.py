"""Pipeline parallelism: one engine on TP x PP GPUs with up to PP batches in flight.

    from sim.planning.instances import simulate_pipeline
    from sim.planning.pipeline import PipelineConfig
    results = simulate_pipeline(config, PipelineConfig(pipeline_parallel_size=2, link="nvlink4"))

As vLLM V1 runs pipeline parallelism (a batch queue of PP batches): the scheduler plans a new batch
as soon as the first stage is free, from the requests not already in a batch in flight. Stages hold
vLLM's layer partition (kernels_cost_model.layer_partition) and a batch spends its own time on each
(kernels_cost_model.stage_times: the first stage also runs the embedding and the engine's CPU time, the
last the final norm and LM head). It enters stage i once it has left stage i-1 and its hidden states
have crossed the link, and once stage i has let the batch ahead of it go; batches leave the last stage
in order. Its tokens are sampled and its stops applied when it leaves. TP ranks within a stage are
priced by the cost model as usual (TP x PP in one deployment). The batch queue takes the place of
async scheduling's one-step look-ahead, so the engine runs with `async_scheduling` off.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

import simpy

from kernels_cost_model.errors import is_int, require
from kernels_cost_model.layer_partition import check_layer_partition
from kernels_cost_model.links import get_link
from kernels_cost_model.stage_times import split_by_layers, stage_times
from sim.api.sections import within
from sim.api.simulator import SimulationConfig
from sim.core.invariants import InvariantError
from sim.engine.engine import Engine
from policies.vllm import VllmV1Policy
from sim.engine.livelock import HIDDEN_IN_FLIGHT_CAUSE, HOLDERS_CAUSE
from sim.engine.simulation import EngineProcess


@dataclass(frozen=True)
class PipelineConfig:
    """Pipeline stages, the link between consecutive stages and, optionally, the layers of each stage
    (vLLM's VLLM_PP_LAYER_PARTITION; None: vLLM's own partition of the model's layers)."""

    pipeline_parallel_size: int = 2
    link: str = "nvlink4"
    layer_partition: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        with within("pipeline"):
            get_link(self.link)
            require(is_int(self.pipeline_parallel_size) and self.pipeline_parallel_size >= 1,
                    "pipeline_parallel_size", self.pipeline_parallel_size, "must be an integer >= 1")
            if self.layer_partition is not None:
                check_layer_partition(self.layer_partition, self.pipeline_parallel_size)   # (its sum: with the model)
                object.__setattr__(self, "layer_partition", tuple(int(n) for n in self.layer_partition))


class PipelineProcess(EngineProcess):
    """EngineProcess whose loop keeps up to one batch per stage in flight; `partition`: the layers
    of each stage."""

    def __init__(self, env: simpy.Environment, engine: Engine, partition: tuple[int, ...], send_time):
        self.partition, self.send_time = tuple(partition), send_time
        self.stages = len(self.partition)
        #: every batch the same time on every stage: equal layers, and a cost model split by layers
        self.even = len(set(self.partition)) == 1 and not hasattr(engine.cost_model, "layer_seconds")
        self.stage_free = [0.0] * self.stages   # when each stage has done with the batches it was given
        self.in_flight: deque = deque()
        self.leaving: deque = deque()   # the processes that land the batches in flight, in order
        self.busy: set = set()
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
            seconds = self.stage_seconds(step)
            exit_at = self._enter(env.now, seconds, self.send_time(sum(step.batch.num_new_tokens)))
            delay = exit_at - env.now
            while env.now + delay < exit_at:  # (the timeout fires at now + delay: never before the last exit)
                delay = math.nextafter(delay, math.inf)
            self.stage_free[-1] = env.now + delay
            self.in_flight.append(step)
            self.busy.update(req for req, _ in step.plan.scheduled)
            self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
            self.leaving.append(env.process(self._leave(step, delay)))
            yield env.timeout(seconds[0])   # the first stage takes the next batch

    def stage_seconds(self, step) -> tuple[float, ...]:
        """The step's seconds on each stage: the cost model's stage times, and what hooks added to the
        step (a CPU tier's wait) shared by layers. A cost model without per-layer terms, or a step with
        no rows, shares its whole duration by layers (stage_times.split_by_layers)."""
        cost = self.engine.cost_model
        if not step.plan.scheduled or not hasattr(cost, "layer_seconds"):
            return split_by_layers(step.duration, self.partition)
        priced = stage_times(cost, step.batch, self.partition)
        if not self.engine.hooks:
            return priced  # (the step's duration is its price: nothing added)
        added = split_by_layers(step.duration - cost.step_time(step.batch), self.partition)
        return tuple(p + a for p, a in zip(priced, added))

    def _enter(self, now: float, seconds: tuple[float, ...], send_s: float) -> float:
        """Run a batch entering the first stage at `now` through the stages: stage j takes it when it
        has left stage j-1 and crossed the link, and stage j has done with the batch ahead; returns
        when it leaves the last stage. Each stage's end is that recursion unrolled: the latest of the
        paths that start at the first stage (`now`) or at a stage k where the batch ahead held it up
        (that batch's end there), each + this batch's seconds on stages k..j (math.fsum) + the sends
        between. Where every batch takes the same time on every stage (`even`) a batch can be held up
        only at the last stage, and the exit is the closed form max(now + PP x stage + sends, last exit
        + stage) bit for bit."""
        ahead, last = tuple(self.stage_free), self.stages - 1
        held_up_at = (last,) if self.even else range(1, self.stages)
        for j in range(self.stages):
            end = now + math.fsum(seconds[:j + 1]) + j * send_s
            for k in held_up_at:
                if k <= j:
                    end = max(end, ahead[k] + math.fsum(seconds[k:j + 1]) + (j - k) * send_s)
            self.stage_free[j] = end
        return end

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
