"""Prefill/decode disaggregation: prefill instances hand each request's KV to a decode instance.

    from sim.planning.disagg import simulate_disaggregated
    out = simulate_disaggregated(config, DisaggConfig(prefill=PoolConfig(2), decode=PoolConfig(1)))
    out.summary["ttft_ms_p99"], out.transfers, out.pool_steps("decode")

As vLLM's disaggregated path (a KV connector such as NIXL) runs it:

1. A request arrives at the prefill pool's router and is prefilled on one prefill instance, which
   samples its first token (TTFT is that token's time).
2. If the first token does not stop it, the prefill instance keeps its blocks (vLLM's delayed free)
   and the decode pool's router picks a decode instance. That instance allocates blocks for the
   prompt, reusing its own prefix-cache hits, first come first served; a request whose blocks do
   not fit waits until a decode step frees some.
3. The missing KV moves over the link (bytes from the model's KV layout, time from the link's
   bandwidth and latency, sharing the sender's and receiver's interfaces fairly with other
   transfers in flight: sim.planning.transfer).
4. On arrival the prefill instance frees its blocks and the request joins the decode instance's
   running batch with its prompt computed and the first token sampled (waiting for a free
   `max_num_seqs` slot if needed); it decodes until it stops.

Every instance is an unmodified engine; hooks (sim.core.hooks) take requests out after their first
token and let decode instances admit arrivals when a step ends.
"""
from __future__ import annotations

import simpy

from kernels_cost_model.errors import ConfigError, require
from kernels_cost_model.links import get_link, hybrid_kv_transfer_bytes, kv_transfer_bytes
from sim.api.simulator import SimulationConfig, check_names, resolve_kv_groups
from sim.core.hooks import EngineHook
from sim.core.invariants import InvariantError
from sim.core.request import RequestStatus
from sim.engine.engine import Engine
from sim.engine.simulation import check_outgrown, check_stalled, run_env, start_workload
from sim.planning.disagg_aborts import abort_at, land_aborted
from sim.planning.disagg_config import DisaggConfig, pool_field
from sim.planning.first_token import decode_request, prefill_spec, recompute_last_prompt_token
from sim.planning.instances import build_engine, make_process
from sim.planning.disagg_results import DisaggResults, collect_results
from sim.planning.routers import make_router
from sim.planning.transfer import LinkFabric, TransferLog


class KVTransferError(ConfigError):
    """A KV transfer that can never fit the decode instance's cache."""


def pool_config(disagg: DisaggConfig, config: SimulationConfig, pool: str) -> SimulationConfig:
    """One instance's config; an error names its TOML path, and a decode cache too small for one
    request is a KVTransferError (a transfer could never fit)."""
    try:
        settings = getattr(disagg, pool)
        instance = settings.shape.config(settings.instance_config(config))
        if pool == "prefill":   # hand off at the step that samples the first token: no step planned ahead
            instance = instance.replace(engine={"async_scheduling": False})
        if settings.kv_offloading_size is not None and not instance.engine.enable_prefix_caching:
            raise ConfigError("kv_offloading_size", settings.kv_offloading_size, "a CPU tier needs prefix caching")
        if settings.kv_offloading_size is not None:   # a tier smaller than a block: named now
            try:
                settings.shape.offload.cpu_blocks(instance)
            except ConfigError as exc:
                raise ConfigError("kv_offloading_size", settings.kv_offloading_size, exc.reason) from None
        # the hand-off follows the engine's own stops: stop strings are found with the token checks
        return instance.replace(engine={"stop_string_detection": "engine"})
    except ConfigError as exc:
        decode_kv = pool == "decode" and exc.field.endswith("num_gpu_blocks")
        error, why = (KVTransferError, "; a KV transfer could never fit it") if decode_kv else (ConfigError, "")
        raise error(pool_field(pool, exc.field), exc.value, exc.reason + why) from None


class HandOff(EngineHook):
    """On a prefill instance: after each step, take out the requests that just sampled their first
    token and did not stop; they keep their blocks until their KV has been sent."""

    #: Under pipeline parallelism a request whose first token is in flight stays out of the plans (it is
    #: never a preemption victim then): preempted there, its first token would land on a request that lost
    #: its KV and it would decode on the prefill instance (sim.planning.pipeline, `PipelineProcess._plan`).
    keeps_in_flight_out_of_plans = True

    def __init__(self, cluster: "DisaggregatedCluster", index: int):
        self.cluster, self.index = cluster, index

    def on_step_end(self, engine, now: float) -> None:
        running = engine.state.running
        done = [r for r in running if len(r.output_token_ids) == 1 and r.num_computed_tokens == r.num_prompt_tokens]
        if done:
            leaving = set(done)
            engine.state.running = [r for r in running if r not in leaving]
            for req in done:
                self.cluster.hand_off(self.index, req, now)


class DecodeAdmission(EngineHook):
    """On a decode instance: when a step ends, admit arrived requests and start waiting transfers."""

    def __init__(self, cluster: "DisaggregatedCluster", index: int):
        self.cluster, self.index = cluster, index

    def has_work(self) -> bool:
        """Arrived requests and a free seat, or a queued transfer whose blocks fit now (another hook's step
        end may have freed them after this one's, e.g. a CPU tier's stores landing): step (even with
        nothing scheduled) to seat them or start it."""
        cluster, d = self.cluster, self.index
        engine = cluster.decode[d]
        if cluster.arrived[d] and len(engine.state.running) < engine.config.max_num_seqs:
            return True
        return bool(cluster.pending[d]) and cluster.transfer_fits(d)

    def on_step_end(self, engine, now: float) -> None:
        self.cluster.admit_arrived(self.index, now)
        self.cluster.start_transfers(self.index)


class Transfer:
    """One request's KV on its way: its prefill-side and decode-side requests and instances."""

    __slots__ = ("source", "destination", "prefill_req", "decode_req", "num_bytes", "num_blocks", "aborted",
                 "flow")

    def __init__(self, source, destination, prefill_req, decode_req):
        self.source, self.destination = source, destination
        self.prefill_req, self.decode_req = prefill_req, decode_req
        self.num_bytes = self.num_blocks = 0
        self.aborted = False
        self.flow = None    # its share of the link (sim.planning.transfer.Flow) once it moves


def pool_error(pool: str, exc: ConfigError) -> ConfigError:
    """`exc` named under the pool's TOML table; a shared setting (the scheduler profile, which may turn
    the hybrid KV manager off, sim.core.hybrid_switch) keeps its own name."""
    shared = exc.field == "engine.scheduler_profile"
    return ConfigError(exc.field if shared else pool_field(pool, exc.field), exc.value, exc.reason)


class DisaggregatedCluster:
    """Prefill and decode instances in one SimPy environment, the routers and the transfer ports."""

    def __init__(self, config: SimulationConfig, disagg: DisaggConfig):
        spec = config.speculative_config
        require(spec is None, "speculative_config.method", spec and spec.method,
                "not simulated with [disaggregation] pools; drop one of the two")
        self.config, self.disagg = config, disagg
        self.env = env = simpy.Environment()
        prefill_cfg = pool_config(disagg, config, "prefill")
        decode_cfg = pool_config(disagg, config, "decode")
        check_names(prefill_cfg.engine), check_names(decode_cfg.engine)
        shapes = {"prefill": disagg.prefill.shape, "decode": disagg.decode.shape}
        self.prefill = [self._engine(prefill_cfg, HandOff(self, i), "prefill", shapes["prefill"])
                        for i in range(disagg.prefill.num_instances)]
        self.decode = [self._engine(decode_cfg, DecodeAdmission(self, i), "decode", shapes["decode"])
                       for i in range(disagg.decode.num_instances)]
        self.prefill_procs = [make_process(env, e, prefill_cfg, shapes["prefill"]) for e in self.prefill]
        self.decode_procs = [make_process(env, e, decode_cfg, shapes["decode"]) for e in self.decode]
        for pool, procs in (("prefill", self.prefill_procs), ("decode", self.decode_procs)):
            for proc in procs:   # (a spinning instance's error names its pool: sim.engine.livelock)
                proc.blocks_field = f"disaggregation.{pool}.num_gpu_blocks"
        block = config.engine.block_size
        self.prefill_router = make_router(disagg.prefill.router, self.prefill_procs, block)
        self.decode_router = make_router(disagg.decode.router, self.decode_procs, block)
        link = get_link(disagg.link)
        ranks = {pool: cfg.deployment.tensor_parallel_size * shapes[pool].pipeline_parallel_size
                 for pool, cfg in (("prefill", prefill_cfg), ("decode", decode_cfg))}
        self.log = TransferLog()
        self.fabric = LinkFabric(env, link, [ranks["prefill"]] * len(self.prefill),
                                 [ranks["decode"]] * len(self.decode), self.log)
        self.model, self.kv_cache_dtype = config.deployment.model, config.deployment.kv_cache_dtype
        self.hybrid_transfers = resolve_kv_groups(decode_cfg, shapes["decode"].connectors) is not None
        self.pending: list[list[Transfer]] = [[] for _ in self.decode]   # waiting for decode blocks
        self.in_flight: dict[str, Transfer] = {}
        self.handoffs: dict[str, Transfer] = {}                           # handed off, not finished
        self.prefill_of: dict[str, int] = {}
        self.original: dict[str, object] = {}                              # each request's own spec
        self.arrived: list[list] = [[] for _ in self.decode]             # KV here, waiting for a seat
        self.done_events: dict[str, simpy.Event] = {}
        self.num_finished: dict[str, int] = {}
        for i, e in enumerate(self.prefill):
            e.on_finish = lambda req, i=i: self._prefill_finished(i, req)
        for i, e in enumerate(self.decode):
            e.on_finish = lambda req, i=i: self._decode_finished(i, req)

    def _engine(self, config: SimulationConfig, hook: EngineHook, pool: str, shape) -> Engine:
        try:
            blocks = shape.num_gpu_blocks(config)
        except ConfigError as exc:
            raise pool_error(pool, exc) from None
        tokens = blocks * config.engine.block_size
        if tokens < config.engine.max_model_len:
            error = KVTransferError if pool == "decode" else ConfigError
            raise error(f"disaggregation.{pool}.num_gpu_blocks", blocks,
                        f"the {pool} instance's KV cache holds {tokens} tokens, less than one "
                        f"max_model_len={config.engine.max_model_len} request"
                        + ("; its KV transfer could never fit" if pool == "decode" else ""))
        try:
            return build_engine(config, shape, [hook], blocks)[0]
        except ConfigError as exc:  # (an engine setting of this pool, e.g. its policy's budget)
            raise pool_error(pool, exc) from None

    # ----- arrivals ----------------------------------------------------------------------------
    def submit(self, spec) -> simpy.Event:
        """The workload's entry: route to a prefill instance; the event succeeds when the request
        has finished (on the prefill instance if its first token stopped it, else on decode)."""
        i = self.prefill_router.choose(spec)
        self.prefill_router.outstanding[i] += 1
        done = self.env.event()
        req = self.prefill[i].add_request(prefill_spec(spec, self.disagg.first_token, self.prefill[i]),
                                          self.env.now)
        if req.is_finished:   # rejected (prompt over max_model_len): finished on arrival
            return done.succeed(req)
        self.done_events[req.request_id] = done
        self.prefill_of[req.request_id] = i
        self.original[req.request_id] = spec
        if spec.abort_time_s is not None:
            self.env.process(abort_at(self, req.request_id, spec.abort_time_s))
        self.prefill_procs[i]._wake()
        return done

    # ----- hand-off ------------------------------------------------------------------------------
    def hand_off(self, source: int, req, now: float) -> None:
        """`req` sampled its first token on prefill instance `source`: queue its KV for a decode instance."""
        engine = self.prefill[source]
        spec = req.spec
        d = self.decode_router.choose(spec)
        self.decode_router.outstanding[d] += 1
        original = self.original[req.request_id]
        if self.disagg.first_token == "decode":
            decode_req = decode_request(self.decode[d], original, req, engine.streams[req.index], now)
        else:
            decode_req = self.decode[d].add_prefilled_request(original, now, req, engine.streams[req.index])
        t = Transfer(source, d, req, decode_req)
        self.handoffs[req.request_id] = t
        self.pending[d].append(t)
        self.start_transfers(d)

    def transfer_fits(self, d: int) -> bool:
        """Whether the first queued transfer to decode instance `d` would get its blocks now."""
        kv, req = self.decode[d].state.kv, self.pending[d][0].decode_req
        hits, num_cached = kv.lookup_gpu_prefix(req)
        return kv.can_fit(req, req.num_prompt_tokens - num_cached, hits)

    def start_transfers(self, d: int) -> None:
        """Start the queued transfers to decode instance `d` whose blocks fit, in order."""
        queue, kv = self.pending[d], self.decode[d].state.kv
        while queue:
            t = queue[0]
            req = t.decode_req
            hits, num_cached = kv.lookup_gpu_prefix(req)   # (a CPU tier serves the scheduler's admissions)
            missing = req.num_prompt_tokens - num_cached
            if kv.allocate(req, missing, hits) is None:
                if -(-req.num_prompt_tokens // kv.block_size) > kv.num_usable_blocks:
                    raise KVTransferError("disaggregation.decode.num_gpu_blocks", kv.num_gpu_blocks,
                                          f"request {req.request_id} needs more blocks than the cache has")
                return
            queue.pop(0)
            req.status = RequestStatus.RUNNING   # holds blocks: vLLM's WAITING_FOR_REMOTE_KVS
            req.num_cached_tokens = num_cached
            t.num_bytes = self.transfer_bytes(req.num_prompt_tokens, num_cached, kv.block_size)
            t.num_blocks = len(kv.blocks_of(req))
            self.in_flight[req.request_id] = t
            t.flow = self.fabric.send(req.request_id, t.source, d, t.num_bytes,
                                      lambda now, t=t: self._transfer_done(t, now))

    def transfer_bytes(self, num_tokens: int, num_cached_tokens: int, block_size: int) -> int:
        """Bytes a prompt of `num_tokens` moves when the decode instance holds its first `num_cached_tokens`:
        each group's blocks where the pools run vLLM's hybrid manager (vllm-0.33 with NIXL), else the
        missing tokens of every layer (the manager off: every layer full attention); in the cache's dtype."""
        if self.hybrid_transfers:
            return hybrid_kv_transfer_bytes(self.model, block_size, num_tokens, num_cached_tokens,
                                            self.kv_cache_dtype)
        return kv_transfer_bytes(self.model, num_tokens - num_cached_tokens, self.kv_cache_dtype)

    def _transfer_done(self, t: Transfer, now: float) -> None:
        check_transfer(t, self.prefill[t.source].state.kv, self.decode[t.destination].state.kv)
        if t.aborted:
            del self.in_flight[t.decode_req.request_id]
            return land_aborted(self, t, now)
        t.prefill_req.status = RequestStatus.FINISHED_LENGTH_CAPPED  # the prefill's max_tokens=1 request
        self.prefill[t.source].complete(t.prefill_req, now)           # frees its held blocks
        del self.in_flight[t.decode_req.request_id]
        self.arrived[t.destination].append(t.decode_req)
        self.admit_arrived(t.destination, now)
        self.prefill_procs[t.source]._wake()

    def admit_arrived(self, d: int, now: float) -> None:
        """Requests whose KV has arrived join decode instance `d`'s batch while seats are free."""
        engine, queue = self.decode[d], self.arrived[d]
        admitted = False
        while queue and len(engine.state.running) < engine.config.max_num_seqs:
            req = queue.pop(0)
            engine.start_prefilled(req, now)
            if self.disagg.first_token == "decode":
                recompute_last_prompt_token(req)
            admitted = True
        if admitted:
            self.decode_procs[d]._wake()

    # ----- completions -----------------------------------------------------------------------------
    def _prefill_finished(self, i: int, req) -> None:
        self.prefill_router.outstanding[i] -= 1
        if req.request_id not in self.handoffs:   # stopped on its first token or aborted: done here
            self._done(req)

    def _decode_finished(self, d: int, req) -> None:
        self.decode_router.outstanding[d] -= 1
        del self.handoffs[req.request_id]
        self._done(req)

    def _done(self, req) -> None:
        self.prefill_of.pop(req.request_id, None)
        self.original.pop(req.request_id, None)
        count = self.num_finished.get(req.request_id, 0) + 1
        self.num_finished[req.request_id] = count
        if count > 1:
            raise InvariantError(f"{req.request_id} finished {count} times")
        event = self.done_events.pop(req.request_id, None)
        if event is not None:   # None: rejected on arrival, answered by submit
            event.succeed(req)

    def run(self, workload, until: float | None = None) -> DisaggResults:
        start_workload(self.env, workload, self.submit, self.config.seed)
        run_env(self.env, until)
        if until is None and self.done_events:
            for pool in ("prefill", "decode"):
                for engine in getattr(self, pool):
                    try:
                        check_outgrown(engine)
                        check_stalled(engine)
                    except ConfigError as exc:
                        raise ConfigError(f"disaggregation.{pool}.{exc.field.removeprefix('engine.')}", exc.value,
                                          exc.reason) from None
            stuck = sorted(self.done_events)[:5]
            raise InvariantError(f"{len(self.done_events)} requests never finished (e.g. {stuck})")
        return collect_results(self)


def check_transfer(t: Transfer, source_kv, destination_kv) -> None:
    """No block lost in transfer: the sender still holds the prompt's blocks, the receiver exactly
    the blocks it allocated for them."""
    needed = -(-t.prefill_req.num_prompt_tokens // source_kv.block_size)
    held = len(source_kv.blocks_of(t.prefill_req))
    got = len(destination_kv.blocks_of(t.decode_req))
    if held < needed or got != t.num_blocks or got < needed:
        raise InvariantError(f"{t.decode_req.request_id}: transfer of {needed} blocks, sender holds {held}, "
                             f"receiver {got} (allocated {t.num_blocks})")


def simulate_disaggregated(config: SimulationConfig, disagg: DisaggConfig, *, workload=None,
                           until: float | None = None) -> DisaggResults:
    """Simulate `config`'s traffic (or `workload`) on the prefill and decode pools of `disagg`."""
    traffic = workload if workload is not None else config.workload.build(
        config.engine.eos_token_id, config.engine.max_model_len)
    return DisaggregatedCluster(config, disagg).run(traffic, until)
