"""The engine step as a plain object: schedule -> price -> (time passes) -> sample and update.

No SimPy here: `sim.engine.simulation` drives it. Tokens become visible at the end of the step, for every
request whose computed tokens catch up with all its tokens (the catch-up rule). That end of a step (sampling,
stop checks) is `TokenUpdate`'s (sim.engine.token_update), mixed into `Engine`; `Step` is in sim.engine.step.
"""
from __future__ import annotations

from policies import get_policy
from policies.base import EngineState
from policies.waiting_queue import make_waiting_queue
from kernels_cost_model.batch import BatchShape
from sim.core.config import EngineConfig
from sim.core.invariants import check_budget, check_decode_rows, check_invariants
from sim.core import kv_lazy
from sim.core.kv_cache import KVCacheManager
from sim.core.kv_managers import kv_manager_for
from sim.core.records import RequestRecords, RunRecords, StepRecords
from sim.core.replay import make_text_state
from sim.core.request import Request, RequestStatus
from sim.core.stop_rules import get_profile, stop_candidates
from sim.core.token_runs import TokenRuns
from sim.engine.lazy_rows import LazyStep, lazy_rows_for
from sim.engine.livelock import SpinWatch
from sim.engine.quiet import quiet_until
from sim.engine.shared_times import SharedTimes
from sim.engine.step import Step
from sim.engine.token_update import TokenUpdate
from workloads.token_streams import stream_for


class Engine(TokenUpdate):
    """One engine replica: queues, KV cache, policy, cost model, stop rules and records."""

    def __init__(self, config: EngineConfig, cost_model, num_gpu_blocks: int, token_text=None,
                 hooks=(), kv_groups=None, kv: KVCacheManager | None = None):
        """`kv`: a KV cache manager of `num_gpu_blocks` blocks to use instead of the plain one
        (e.g. sim.core.kv_offload's, with a host-memory tier)."""
        self.config = config = config.resolved()
        self.is_async = config.is_async  # (a property that looks up the scheduler profile)
        self.cost_model = cost_model
        self.policy = get_policy(config.policy)
        if self.policy.whole_prompts:  # (named now, not at the first step)
            self.policy.require_whole_prompt_budget(config)
        self.stop_profile = get_profile(config.stop_profile)
        self.token_text = token_text
        if kv is None:
            kv = kv_manager_for(config, num_gpu_blocks, kv_groups)
        self.state = EngineState(config, kv, waiting=make_waiting_queue(config.scheduling))
        self.requests = RequestRecords()
        self.steps = StepRecords()
        if config.record_token_times == "runs":
            self.requests.token_runs = TokenRuns(self.steps)
        self.by_id: dict[str, Request] = {}
        self.quick_stop: list = []     # per request index: (stop token ids, length limit) or None
        self.streams: list = []        # per request index: position -> token id
        self.stream_tokens: list = []  # per request index: its stream's first tokens, read ahead (or None)
        self.on_finish = None          # callback(request) set by the simulation
        self.on_spin = None            # callback() set by the simulation: a preempt-only plan recurred
        self.spin_watch = SpinWatch()  # (sim.engine.livelock)
        self.pending_aborts: list[Request] = []
        self.frontend_aborts: list[Request] = []  # stop strings found; abort lands during the next step
        self.strings_in_frontend = config.stop_strings_in_frontend
        self.refuses_over_length = config.refuses_over_length
        self.steps_in_flight = 0       # planned, results not applied (2 at a time under async)
        self.following_covers = False  # the step finishing has one in flight after it that covers_running
        self.hooks = list(hooks)       # sim.core.hooks.EngineHook objects (none: the plain engine)
        self.apply_rows = self._apply_rows  # a hook may take over the token update (spec decoding)
        #: planning a step registers its rows' blocks full with known tokens (the plain manager's
        #: `allocate` and the policies' inlined growth): `_apply_rows` skips that check for a row in
        #: the step planned next (it registered everything this row could; see `_apply_rows`)
        self.plan_registers = (type(kv).allocate is KVCacheManager.allocate
                               and type(kv).cache_full_blocks is KVCacheManager.cache_full_blocks)
        if kv_lazy.ENABLED:
            kv.enable_private_prefixes()
        for hook in self.hooks:
            hook.on_attach(self)
        #: fast mode: steps that schedule every running request time their rows at once, under a
        #: policy whose steps nearly all do (under vLLM V1's, a request whose last token is in flight
        #: sits out the next step, and the lists' catching up cost ~1 % more bytecodes than it saved)
        self.shared_times = (SharedTimes() if config.mode == "fast" and not self.hooks and config.record_token_times
                             and self.policy.shares_step_times else None)
        self.lazy_rows = None  # sim.engine.lazy_rows, where `keep_rows_lazy` turned it on

    def keep_rows_lazy(self) -> bool:
        """Leave quiet rows alone in steps of decodes (sim.engine.lazy_rows) where that applies: for an
        engine whose rows only its own loop reads (`run_engine`'s). Whether it does."""
        self.lazy_rows = lazy_rows_for(self)
        return self.lazy_rows is not None

    def settle(self) -> None:
        """Bring every running request's counters and tokens up to date (lazy rows end)."""
        if self.lazy_rows is not None:
            self.lazy_rows.deactivate()

    # ----- arrivals and aborts ------------------------------------------------------------
    def add_request(self, spec, now: float) -> Request:
        """Queue a request; one whose prompt leaves no room for an output token within max_model_len
        is recorded as rejected (vLLM's front end refuses it before the engine), and so is one whose
        prompt + max_tokens exceeds max_model_len where the front end is `vllm serve`'s
        (`EngineConfig.refuses_over_length`)."""
        index = len(self.requests)
        request_id = spec.request_id or f"req-{index}"
        if request_id in self.by_id:
            raise ValueError(f"request_id={request_id!r}: already in flight; ids must be unique")
        self.requests.add(spec, request_id, now, self.config.record_token_times)
        params = spec.sampling_params
        text = make_text_state(params, self.stop_profile, self.token_text) if params.stop else None
        req = Request(request_id, spec.prompt_token_ids, params, self.config.eos_token_id, now,
                      spec.priority, text, spec, index)
        self.by_id[request_id] = req
        self._add_stop_and_stream(req, stream_for(spec, index, self.config.eos_token_id))
        if self._refused(req.num_prompt_tokens, params.max_tokens):
            self.requests.rejected[index] = True
            self._finish(req, RequestStatus.FINISHED_IGNORED, now)
        else:
            self._require_min_tokens_room(req)
            self._track_prefix(req, True)
            self.state.waiting.append(req)
        return req

    def _require_min_tokens_room(self, req: Request) -> None:
        """A request that would never stop under the stop profile (`StopProfile.require_min_tokens_room`):
        named at arrival, not run for ever."""
        if req.sampling_params.min_tokens:
            self.stop_profile.require_min_tokens_room(
                req.sampling_params.min_tokens, self.config.max_model_len - req.num_prompt_tokens,
                f"request {req.request_id!r} (max_model_len={self.config.max_model_len})")

    def refuses(self, spec) -> bool:
        """Whether the front end refuses `spec` before this engine sees it (`_refused`)."""
        return self._refused(spec.num_prompt_tokens, spec.sampling_params.max_tokens)

    def _refused(self, prompt_len: int, max_tokens: int | None) -> bool:
        """Whether the front end refuses a request of this prompt and max_tokens (vLLM 0.19's OpenAI
        server: entrypoints/openai/engine/serving.py and renderers/params.py, `_token_len_check`)."""
        limit = self.config.max_model_len
        if prompt_len >= limit:
            return True
        return self.refuses_over_length and max_tokens is not None and prompt_len + max_tokens > limit

    def _track_prefix(self, req: Request, private_ok: bool) -> None:
        """Hand a request entering the engine to the KV manager's deferred registration, if on."""
        kv = self.state.kv
        if kv.lazy is not None:
            key = kv_lazy.first_block_key(req, self.streams[req.index], kv.block_size)
            if self.lazy_rows is not None and self.lazy_rows.count:  # (a holder's marked blocks may be
                self.lazy_rows.materialise_rows(kv.lazy.holders.get(key, ()))  # hashed now: from its tokens)
            kv.lazy.arrive(req, key, private_ok)

    # ----- disaggregated decode (vLLM's KV-transfer path) ----------------------------------
    def add_prefilled_request(self, spec, now: float, prefilled: Request, stream) -> Request:
        """Register a request whose prompt KV another instance computed (the decode side of
        prefill/decode disaggregation). It carries the prefill's sampled tokens, stop-string state
        and token `stream`; it is not queued: the caller allocates its blocks in `state.kv` while the
        KV arrives and calls `start_prefilled` once it has."""
        index = len(self.requests)
        self.requests.add(spec, prefilled.request_id, now, self.config.record_token_times)
        req = Request(prefilled.request_id, spec.prompt_token_ids, prefilled.sampling_params,
                      self.config.eos_token_id, prefilled.arrival_time, spec.priority,
                      prefilled.text_state, spec, index)
        req.output_token_ids.extend(prefilled.output_token_ids)
        self.by_id[req.request_id] = req
        self._add_stop_and_stream(req, stream)
        self._track_prefix(req, False)
        return req

    def _add_stop_and_stream(self, req: Request, stream) -> None:
        """A new request's stop candidates (none known with stop strings) and token stream."""
        self.quick_stop.append(None if req.text_state else stop_candidates(req, self.config.max_model_len))
        self.streams.append(stream)
        self.stream_tokens.append(None)
        self.set_stream(req, stream)

    def set_stream(self, req: Request, stream) -> None:
        """`req` reads its tokens from `stream` (position -> token id) from its next token on."""
        self.streams[req.index] = stream
        self.stream_tokens[req.index] = None
        req.quiet_until = quiet_until(stream, self.quick_stop[req.index], len(req.output_token_ids))

    def start_prefilled(self, req: Request, now: float) -> None:
        """The prompt's KV has arrived: `req` joins the running batch as a decode (its next step
        computes the token the prefill instance sampled)."""
        req.num_computed_tokens = req.num_prompt_tokens
        req.status = RequestStatus.RUNNING
        if self.shared_times is not None:
            self.shared_times.join(req)
        self.state.kv.cache_full_blocks(req)
        self.state.running.append(req)
        self.requests.first_scheduled_time[req.index] = now

    def abort(self, request_id: str, now: float) -> None:
        """Client disconnect: finish as aborted and free KV now, or, while a step runs, at its end
        before its outputs are applied (as vLLM's engine core drains its abort queue)."""
        req = self.by_id.get(request_id)
        if req is None or req.is_finished:
            return
        if self.steps_in_flight and req.status == RequestStatus.RUNNING:
            self.pending_aborts.append(req)
            return
        self._abort_now(req, now)

    def _abort_now(self, req: Request, now: float) -> None:
        if req.is_finished:
            return
        if req.status == RequestStatus.RUNNING:
            if req.lazy_seq >= 0:
                self.lazy_rows.abort(req)
            self.state.running.remove(req)
        elif not self.state.kv.is_loading(req):   # (a loading request is in no queue)
            self.state.waiting.remove(req)
        self._finish(req, RequestStatus.FINISHED_ABORTED, now)

    # ----- the step ------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.state.running or self.state.waiting) or self._hooks_have_work()

    def _hooks_have_work(self) -> bool:
        return any(hook.has_work() for hook in self.hooks)

    def plan_step(self, now: float) -> Step | None:
        """Schedule the next step and price it; None if nothing can run.

        A step that only preempted (nothing fitted) is returned empty, with no duration: the engine
        schedules again at once, as vLLM's loop does.
        """
        lazy = self.lazy_rows
        if lazy is None:
            plan = self.policy.schedule(self.state)
        else:
            plan = lazy.schedule()
            if plan is None:  # a step of decodes over lazy rows
                return lazy.plan_decodes(now)
        if not plan.scheduled and not plan.preempted and not self._hooks_have_work():
            if self.frontend_aborts:
                self._deliver_frontend_aborts(now)
            return None
        scheduled = plan.scheduled
        if self.config.check_invariants:
            check_decode_rows(plan)
        if self.hooks:  # a hook reads the rows before they advance
            new = [n for _, n in scheduled]
            context, samples = self._rows(scheduled)
        else:
            new, context, samples = self._rows_advanced(plan)
        if plan.admitted or plan.preempted:  # (a decode step under overload has neither)
            self._queue_moves(plan, now)
        covers = len(scheduled) == len(self.state.running)
        shared = self.shared_times
        all_decodes = plan.num_decodes == len(scheduled)  # (each samples: `SchedulerOutput.num_decodes`)
        batch = BatchShape(new, context, len(samples) if all_decodes else sum(samples))
        if self.config.check_invariants:
            check_budget(plan, self.config)
        self.steps_in_flight += 1
        duration = self.cost_model.step_time(batch) if scheduled else 0.0
        step = Step(plan, batch, duration, now, 0, samples, covers,
                    shared.take() if shared is not None and covers and scheduled else None,
                    all_decodes and not self.hooks)
        if self.hooks:
            for hook in self.hooks:
                hook.on_plan(self, step)
            self._advance(step)
        if self.frontend_aborts:
            self._deliver_frontend_aborts(now)
        if not scheduled and plan.preempted and not self.state.running and self.on_spin is not None \
                and self.spin_watch.recurred(self):
            self.on_spin()
        return step

    def _queue_moves(self, plan, now: float) -> None:
        """The plan's admitted requests are first scheduled at `now` (unless they were before a
        preemption); under shared step times they start running, its preempted ones stop."""
        first_scheduled = self.requests.first_scheduled_time
        for req in plan.admitted:
            if first_scheduled[req.index] != first_scheduled[req.index]:  # NaN: first time
                first_scheduled[req.index] = now
        if self.shared_times is not None:
            self._shared_times_moves(self.shared_times, plan)

    def _shared_times_moves(self, shared: SharedTimes, plan) -> None:
        """The plan's admitted requests start running, its preempted ones stop (shared step times)."""
        token_times = self.requests.token_times
        for req in plan.preempted:
            shared.leave(req, token_times[req.index])
        running = RequestStatus.RUNNING
        for req in plan.admitted:
            if req.status is running:
                shared.join(req)

    @staticmethod
    def _rows(scheduled: list) -> tuple[list, list]:
        """The rows' context (tokens computed before the step) and whether each samples (catches up)."""
        context = [r.num_computed_tokens for r, _ in scheduled]
        samples = [c + n >= r.num_prompt_tokens + len(r.output_token_ids) + r.num_output_placeholders
                   for c, (r, n) in zip(context, scheduled)]
        return context, samples

    def _rows_advanced(self, plan) -> tuple[list, list, list]:
        """The rows' new tokens, then `_rows` and `_advance`, in one pass over the rows (the plain
        engine's hot path). The plan's first `num_decodes` rows are one-token decodes that sample
        (`SchedulerOutput.num_decodes`): they advance untested."""
        scheduled = plan.scheduled
        decodes = plan.num_decodes
        if not decodes:
            return self._rows_tested(scheduled, [], [], [])
        rows = scheduled if decodes == len(scheduled) else scheduled[:decodes]
        context = []
        to_context = context.append
        if self.is_async:  # each leaves a placeholder until its token is known: its token in flight
            for req, _ in rows:
                computed = req.num_computed_tokens
                to_context(computed)
                req.num_computed_tokens = computed + 1
                req.num_output_placeholders += 1
        else:
            for req, _ in rows:
                computed = req.num_computed_tokens
                to_context(computed)
                req.num_computed_tokens = computed + 1
                req.num_in_flight_extra += 1
        new, samples = [1] * decodes, [True] * decodes
        if decodes == len(scheduled):
            return new, context, samples
        return self._rows_tested(scheduled[decodes:], new, context, samples)

    def _rows_tested(self, scheduled: list, new: list, context: list, samples: list) -> tuple[list, list, list]:
        """`_rows_advanced` for rows of any kind, appended to the lists given: each row is tested for
        whether it catches up (samples)."""
        to_new, to_context, to_samples = new.append, context.append, samples.append
        async_ = self.is_async
        for req, n in scheduled:
            to_new(n)
            computed = req.num_computed_tokens
            to_context(computed)
            req.num_computed_tokens = computed = computed + n
            if computed >= req.num_prompt_tokens + len(req.output_token_ids) + req.num_output_placeholders:
                to_samples(True)
                if async_:  # a placeholder: one of its tokens in flight
                    req.num_output_placeholders += 1
                    req.num_in_flight_extra += n - 1
                    continue
            else:
                to_samples(False)
            req.num_in_flight_extra += n
        return new, context, samples

    def _deliver_frontend_aborts(self, now: float) -> None:
        """The front end's aborts for stop strings it found reach the engine while the next step runs
        (applied at its end, before its outputs), or at once if no step is in flight. Callers check there
        are some (a call a step saved)."""
        if self.steps_in_flight:
            self.pending_aborts.extend(self.frontend_aborts)
        else:
            for req in self.frontend_aborts:
                self._abort_now(req, now)
        self.frontend_aborts.clear()

    def _advance(self, step: Step) -> None:
        """Count the step's tokens as computed now (vLLM advances at schedule time); under async
        scheduling a sampling row leaves a placeholder until its token is known."""
        if not self.is_async:
            for req, n in step.plan.scheduled:
                req.num_computed_tokens += n
                req.num_in_flight_extra += n
            return
        for (req, n), samples in zip(step.plan.scheduled, step.samples):
            req.num_computed_tokens += n
            if samples:  # a placeholder: one of its tokens in flight
                req.num_output_placeholders += 1
                n -= 1
            req.num_in_flight_extra += n

    def finish_step(self, step: Step, now: float, following: Step | None = None) -> list[Request]:
        """Apply the step's results at its end: aborts that came meanwhile first, then sample the
        rows that caught up, stop, free. `following`: the step planned after it, in flight (async
        scheduling), where the caller knows it."""
        self.steps_in_flight -= 1
        self.following_covers = following is not None and following.covers_running
        if self.pending_aborts:
            for req in self.pending_aborts:
                self._abort_now(req, now)
            self.pending_aborts.clear()
        lazy = self.lazy_rows
        if lazy is not None and lazy.count and not (step.__class__ is LazyStep and step.pending):
            lazy.before_other_end(step)
            finished = self.apply_rows(step, now)
            lazy.after_other_end(finished)
        else:
            finished = self.apply_rows(step, now)
        if finished or self.hooks:  # (a hook ends each step in `_retire`)
            self._retire(finished, now)
        self._record_step(step, now)
        if self.config.check_invariants:
            check_invariants(self)
        return finished

    def retire(self, finished: list[Request], now: float) -> None:
        """Take `finished` (stopped at `now`) off the queues and finish them, as a step's end does."""
        self._retire(finished, now)

    def _retire(self, finished: list[Request], now: float) -> None:
        if self.hooks:
            self._retire_with_hooks(finished, now)
            return
        if not finished:
            return
        self._drop_from_queues(finished)
        for req in finished:
            self._finish(req, req.status, now)

    def _drop_from_queues(self, finished: list[Request]) -> None:
        """Take stopped requests off the queues (a preempted one can stop on a token of a step
        planned before its preemption), in place, as a preemption does. A step ends with a request
        or two stopped: a scan in C for each (`list.remove`) is a fraction of a filtered copy of the
        running list; many at once (a leap's end) take one filtered pass."""
        running, waiting = self.state.running, self.state.waiting
        if len(finished) > 4:
            done = set(finished)
            kept = [r for r in running if r not in done]
            all_running = len(running) - len(kept) == len(done)
            running[:] = kept
            if all_running:
                return  # (no scan of a waiting queue that grows under overload)
        for req in finished:
            try:
                running.remove(req)
            except ValueError:  # (not running: preempted, waiting; or gone already)
                if req in waiting:
                    waiting.remove(req)

    def _retire_with_hooks(self, finished: list[Request], now: float) -> None:
        """A hook may defer a stopped request's completion (its KV goes now), then ends its step."""
        self._drop_from_queues(finished)
        for req in finished:
            if any(hook.on_stop(self, req, now) for hook in self.hooks):
                self.state.kv.free(req, forget=True)
            else:
                self._finish(req, req.status, now)
        for hook in self.hooks:
            hook.on_step_end(self, now)

    def complete(self, req: Request, now: float) -> None:
        """Record the finish of a stopped request whose completion a hook deferred."""
        self._finish(req, req.status, now)

    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        """The request leaves the engine: KV freed; recorded as the client sees it (unless the
        client already saw it finish on a stop string the front end found)."""
        req.status = status
        self.state.kv.free(req, forget=True)
        del self.by_id[req.request_id]
        index = req.index  # keep records only, not the prompt nor the tokens
        self.streams[index] = self.stream_tokens[index] = self.quick_stop[index] = None
        if self.shared_times is not None:
            self.shared_times.leave(req, self.requests.token_times[index])
        self.requests.compact_token_times(req.index)
        if not req.client_finished:
            self._record_finish(req, now)

    def _record_finish(self, req: Request, now: float) -> None:
        """What the client sees at its finish: time, outputs, reasons."""
        rec, i = self.requests, req.index
        rec.finish_time[i] = now
        rec.num_output_tokens[i] = len(req.output_token_ids)
        rec.num_preemptions[i] = req.num_preemptions
        rec.num_cached_tokens[i] = req.num_cached_tokens
        rec.finish_reason[i] = req.finish_reason
        rec.stop_reason[i] = req.stop_reason
        if self.on_finish is not None:
            self.on_finish(req)

    def _record_step(self, step: Step, now: float) -> None:
        state = self.state
        decode = step.num_decode
        if step.all_decodes:  # (every row samples: `BatchShape.num_sampled` counts them)
            rows = new_tokens = step.batch.num_sampled
        else:
            rows, new_tokens = len(step.plan.scheduled), sum(step.batch.num_new_tokens)
        self.steps.append_row((step.start, step.duration, new_tokens - decode, decode,
                               rows, step.batch.num_sampled, len(step.plan.preempted),
                               *state.kv.block_counts(), len(state.running), len(state.waiting)))

    def records(self, end_time: float) -> RunRecords:
        self.settle()
        if self.shared_times is not None:  # (the running requests' token times, as far as known)
            token_times = self.requests.token_times
            for req in self.state.running:
                self.shared_times.catch_up(req, token_times[req.index])
        return RunRecords(self.requests, self.steps, self.state.kv.num_gpu_blocks,
                          self.config.block_size, end_time)
