"""The end of a step: each row that caught up samples its token, which is appended, timed and stop-checked.

`TokenUpdate` is mixed into `Engine` (sim.engine.engine), which owns the queues, streams, stop profile and
records it reads; `_apply_rows` is the simulator's hot loop.
"""
from __future__ import annotations

from sim.core.request import Request, RequestStatus
from sim.engine.quiet import ALWAYS_CHECK, quiet_until
from sim.engine.lazy_rows import LazyStep
from sim.engine.step import Step
from workloads.token_streams import natural_length, read_tokens

#: Tokens a stream with no natural end is first read ahead by (`TokenUpdate._read_ahead`); twice as far each next time
READ_AHEAD = 32


class TokenUpdate:
    """Sampling and stop checks at a step's end (a mixin of `Engine`)."""

    def _apply_rows(self, step: Step, now: float) -> list[Request]:
        """Sample every row that caught up and stop-check it.

        The hot loop of the simulator: a running row that samples (nearly all) is handled here with
        `emit_token` inlined (a call per token costs ~25%), and what is fixed for the step is read
        once before it; the others (stale, preempted, stopped, mid-prefill) go to `_apply_other_row`.
        A step of decodes only (`Step.all_decodes`) takes `_apply_decodes`.
        """
        client_finishes = self.strings_in_frontend  # else no request's client finishes before it
        if step.all_decodes and not client_finishes:
            return self._apply_decodes(step, now)
        finished = []
        stream_tokens, token_times = self.stream_tokens, self.requests.token_times
        first_token = self.requests.first_token_time
        async_, running = self.is_async, RequestStatus.RUNNING
        caching, exact = self._registers_at_end()
        num_decode = step.batch.num_new_tokens.count(1)  # less the rows of one token that are not decodes
        shared, slot, owed_before = self._time_slot(step, now)
        for (req, n), samples in zip(step.plan.scheduled, step.samples):
            if req.num_stale_tokens or not samples or req.status is not running:
                num_decode -= self._apply_other_row(req, n, samples, now, finished, slot)
                continue
            if not async_:
                req.num_in_flight_extra -= n
            else:  # its placeholder was one of its tokens in flight (a decode's only one)
                req.num_output_placeholders -= 1
                if n != 1:
                    req.num_in_flight_extra -= n - 1
            output = req.output_token_ids
            position = len(output)
            index = req.index
            if not position:
                first_token[index] = now
                if n == 1:
                    num_decode -= 1
            try:  # (a list read costs a fifth of a stream call)
                token = stream_tokens[index][position]
            except (TypeError, IndexError):  # not read ahead yet, or not this far
                token = self._read_ahead(req, position)
            if client_finishes and req.client_finished:
                if slot is not None:
                    shared.skip(req, token_times[index], slot)
                if self._after_client_finish(req, token):
                    finished.append(req)
                continue
            output.append(token)
            if caching and (req.num_computed_tokens >= req.kv_register_at or exact):
                self._register_written(req, position)
            if slot is None:
                times = token_times[index]
                if times is not None:
                    if owed_before >= 0 and req.times_mark < owed_before:
                        shared.catch_up(req, times)
                    times.append(now)
            if position >= req.quiet_until and self._stops_on(req, token, position, now):
                finished.append(req)  # (below `quiet_until` it cannot stop, known without the token)
        step.num_decode = num_decode
        return finished

    def _apply_decodes(self, step: Step, now: float) -> list[Request]:
        """`_apply_rows` for a step whose rows are all one-token decodes that sample (`Step.all_decodes`),
        where no client finishes before the engine: the same updates, less the tests that cannot hold.
        A step planned over lazy rows updates only the rows due at its end (`LazyRows.finish`)."""
        if step.__class__ is LazyStep and step.pending:
            return self.lazy_rows.finish(step, now)
        finished = []
        stream_tokens, token_times = self.stream_tokens, self.requests.token_times
        first_token = self.requests.first_token_time
        async_, running = self.is_async, RequestStatus.RUNNING
        caching, exact = self._registers_at_end()
        num_decode = step.plan.num_decodes
        shared, slot, owed_before = self._time_slot(step, now)
        for req, _ in step.plan.scheduled:
            if req.num_stale_tokens or req.status is not running:
                num_decode -= self._apply_other_row(req, 1, True, now, finished, slot)
                continue
            if async_:  # its placeholder was its token in flight
                req.num_output_placeholders -= 1
            else:
                req.num_in_flight_extra -= 1
            output = req.output_token_ids
            position = len(output)
            try:
                token = stream_tokens[req.index][position]
            except (TypeError, IndexError):
                token = self._read_ahead(req, position)
            output.append(token)
            if not position:
                first_token[req.index] = now
                num_decode -= 1
            if caching and (req.num_computed_tokens >= req.kv_register_at or exact):
                self._register_written(req, position)
            if slot is None:
                times = token_times[req.index]
                if times is not None:
                    if owed_before >= 0 and req.times_mark < owed_before:
                        shared.catch_up(req, times)
                    times.append(now)
            if position >= req.quiet_until and self._stops_on(req, token, position, now):
                finished.append(req)
        step.num_decode = num_decode
        return finished

    def _registers_at_end(self) -> tuple[bool, bool]:
        """(whether a row that samples may have blocks to register full at the step's end, whether that
        is checked on every row: else from `req.kv_register_at` tokens on).

        Under async scheduling a row registers its blocks full with known tokens. A row of a request
        in the step planned next needs no check where planning registers: that plan registered up to
        min(computed + its tokens, tokens known then) with `computed` <= prompt + outputs (it lacked
        a token, one sample in flight at most), which covers min(known now, written) here; where that
        step scheduled every running request (`Step.covers_running`) no row needs it."""
        kv = self.state.kv
        caching = self.is_async and kv.enable_prefix_caching and not (self.plan_registers and self.following_covers)
        return caching, not kv.registers_at

    def _register_written(self, req: Request, position: int) -> None:
        """Register `req`'s blocks full with tokens known and written, its token at output `position`
        just appended (`_registers_at_end`); skipped, as `cache_full_blocks` would, if none is new."""
        in_flight = req.num_output_placeholders + req.num_in_flight_extra
        if self.plan_registers and in_flight:
            return  # (a row of the step planned next: that plan registered it)
        known = req.num_prompt_tokens + position + 1  # its tokens, or its KV written so far
        written = req.num_computed_tokens - in_flight
        if written < known:
            known = written
        kv = self.state.kv
        if known // kv.block_size > kv.num_hashed_blocks.get(req, 0):
            kv.cache_full_blocks(req, known)

    def _time_slot(self, step: Step, now: float) -> tuple:
        """(the engine's shared times, the step's slot, written now if any, the slots written before it,
        owed by rows that catch up: -1 without shared times)."""
        shared, slot = self.shared_times, step.time_slot
        if slot is not None:  # every row that samples is timed by the step's slot
            shared.write(slot, now, self.state.running)
        return shared, slot, shared.written if shared is not None else -1

    def _stops_on(self, req: Request, token: int, position: int, now: float) -> bool:
        """The stop rules on `token`, just appended at output `position` at or past the request's
        `quiet_until` (which moves on): True if it leaves the engine now."""
        index = req.index
        quick = self.quick_stop[index]
        if req.quiet_until != ALWAYS_CHECK:
            req.quiet_until = quiet_until(self.streams[index], quick, position + 1)
        if quick is not None and token not in quick[0] and position + 1 < quick[1]:
            return False  # cannot stop on this token under any profile
        return self.stop_profile.apply(req, self.config.max_model_len) \
            and self._stops_in_engine(req, now, RequestStatus.RUNNING)

    def _read_ahead(self, req: Request, position: int) -> int:
        """Token `position` of `req`'s stream, read ahead into `stream_tokens` from where its list ends:
        at first to the stream's natural length (within `max_tokens`) or `READ_AHEAD` tokens, then
        twice as far each time."""
        index = req.index
        tokens = self.stream_tokens[index]
        if tokens is None:
            tokens = self.stream_tokens[index] = []
        stream, start = self.streams[index], len(tokens)
        natural, most = natural_length(stream), req.sampling_params.max_tokens
        if most is not None and most < natural:
            natural = most
        tokens += read_tokens(stream, start, max(position + 1, 2 * start, READ_AHEAD, natural))
        return tokens[position]

    def _apply_other_row(self, req: Request, n: int, samples: bool, now: float, finished: list,
                         slot: int | None = None) -> int:
        """`_apply_rows` for a row that is stale (planned before its request's preemption), does not
        sample (mid-prefill) or whose request is no longer running: a stale row's token still lands
        (no placeholder of its own to clear, no blocks to register); a stopped or aborted request's is
        wasted. Appends the request to `finished` if the token stops it; returns 1 for a row of one token
        that is not a decode (it samples no token or its first). `slot`: the step's shared times slot,
        which times none of these rows."""
        if slot is not None:
            self.shared_times.skip(req, self.requests.token_times[req.index], slot)
        stale = req.num_stale_tokens
        if stale:
            req.num_stale_tokens = stale - n
        if not samples or req.is_finished:
            req.num_in_flight_extra -= n
            return 1 if n == 1 else 0
        if self.is_async and not stale:  # (a stale row's placeholder went at the preemption)
            req.num_output_placeholders -= 1
            req.num_in_flight_extra -= n - 1
        else:
            req.num_in_flight_extra -= n
        position = len(req.output_token_ids)
        if self.emit_token(req, self.streams[req.index](position), now):
            finished.append(req)
        return 1 if n == 1 and not position else 0

    def _stops_in_engine(self, req: Request, now: float, status: RequestStatus) -> bool:
        """A request the stop rules just stopped leaves the engine now, unless a stop string stopped it
        and the front end finds those: then the client is told now and the engine keeps running it
        until the front end's abort lands (`_deliver_frontend_aborts`), in its `status` from before."""
        if not (self.strings_in_frontend and req.status == RequestStatus.FINISHED_STOPPED
                and isinstance(req.stop_reason, str)):
            return True
        if self.stop_profile.check_token(req, self.config.max_model_len) is not None:
            return True  # the engine core ended it too (a length cap on the same token)
        self._record_finish(req, now)
        req.client_finished = True
        req.status = status
        self.frontend_aborts.append(req)
        return False

    def _after_client_finish(self, req: Request, token: int) -> bool:
        """A token sampled for a request the client already saw finish: the engine appends it and runs
        its token checks only (the front end drops it). True if those stop it."""
        req.output_token_ids.append(token)
        result = self.stop_profile.check_token(req, self.config.max_model_len)
        if result is None:
            return False
        req.status, _ = result
        return True

    def emit_token(self, req: Request, token: int, now: float) -> bool:
        """Append `token` to `req`'s output, record its time and run the stop rules. True if stopped."""
        if req.client_finished:
            return self._after_client_finish(req, token)
        self._append_timed(req, token, now)
        return self.stops_on_last_token(req, now)

    def _append_timed(self, req: Request, token: int, now: float) -> None:
        output = req.output_token_ids
        if not output:
            self.requests.first_token_time[req.index] = now
        output.append(token)
        times = self.requests.token_times[req.index]
        if times is not None:
            if self.shared_times is not None:
                self.shared_times.catch_up(req, times)
            times.append(now)

    def emit_step(self, req: Request, stream, position: int, count: int, now: float) -> bool:
        """Emit the `count` tokens one step gives `req` (1 + the drafts it accepted under speculative
        decoding), read from `stream` from output `position` on, each through `emit_token` until one stops
        it; the rest are dropped, unless the stop profile keeps them (`_keep_rest_of_step`). True if stopped."""
        profile = self.stop_profile
        if count == 1 or not profile.keeps_tokens_after_stop_string or req.text_state is None \
                or req.client_finished:
            return any(self.emit_token(req, stream(position + j), now) for j in range(count))
        text_before, max_model_len = req.text_state.text, self.config.max_model_len
        for j in range(count):
            status = req.status
            self._append_timed(req, stream(position + j), now)
            if not profile.apply(req, max_model_len):
                continue
            if j + 1 < count and profile.keeps_rest_of_step(req, max_model_len):
                self._keep_rest_of_step(req, (stream(position + i) for i in range(j + 1, count)), text_before,
                                        position + 1, now)
            return self._stops_in_engine(req, now, status)
        return False

    def _keep_rest_of_step(self, req: Request, rest, text_before: str, first: int, now: float) -> None:
        """A stop string completed before the step's last token, under a stop profile that keeps the step's
        later tokens (vLLM 0.19.1): the engine core appends them (its token checks may end the request), and
        the client gets them all, timed with the step (`StopProfile.finish_step`)."""
        output = req.output_token_ids
        kept = len(output)
        self.stop_profile.finish_step(req, rest, text_before, first, self.config.max_model_len)
        times = self.requests.token_times[req.index]
        if times is not None:
            if self.shared_times is not None:
                self.shared_times.catch_up(req, times)
            times.extend([now] * (len(output) - kept))

    def stops_on_last_token(self, req: Request, now: float) -> bool:
        """Run the stop rules on the token `req` sampled last (appended and timed): True if it leaves
        the engine now (`_apply_rows` inlines the same)."""
        output = req.output_token_ids
        quick = self.quick_stop[req.index]
        if quick is not None and output[-1] not in quick[0] and len(output) < quick[1]:
            return False  # cannot stop on this token under any profile
        status = req.status
        return (self.stop_profile.apply(req, self.config.max_model_len)
                and self._stops_in_engine(req, now, status))
