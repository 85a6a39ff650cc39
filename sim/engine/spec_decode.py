"""Speculative decoding as an engine hook, with vLLM V1's semantics.

- Drafts: after a step in which a request sampled and did not stop, the proposer gives it
  `draft_limit` drafts (k, capped by what it may still emit and by max_model_len). The scheduler
  sees them through `Request.num_tokens_with_spec`: a decode asks for 1 + drafts tokens, cut by
  the token budget like any chunk; a cut drops the trailing drafts.
- Verification: a row whose computed tokens reach its real tokens samples (the catch-up rule);
  the scheduled positions past them are its drafts. The acceptance model accepts a prefix of them;
  the rejected ones are un-computed (`num_computed_tokens` drops; their KV slots stay allocated
  and are written again next step). The accepted drafts and the bonus token are the request's own
  stream tokens, appended one at a time, each through the stop rules; after a stop the rest are
  dropped (vLLM's `_update_request_with_output`).
- Cost: the step is repriced with its verification rows as decode-like rows of 1 + drafts
  queries (`kernels_cost_model.speculative.verify_step_time`), the drafts' LM-head rows (logits
  for every verified position) added, plus the proposer's time (`ProposerCost`).
- KV: EAGLE / MTP / draft-model proposers reserve k lookahead slots per allocation.
- Async scheduling (vLLM V1's AsyncScheduler): step N+1 is planned before step N's tokens are
  known. A sampling row leaves 1 + drafts output placeholders (`num_output_placeholders`) and is
  given placeholder drafts for its next step at once (`num_spec_tokens`, capped as if every
  placeholder were emitted), so the next step verifies 1 + k tokens from the optimistic position;
  when its results arrive the rejected drafts come off both `num_computed_tokens` and the
  placeholders (the GPU side re-bases the in-flight step on the real position). Hence the
  invariant computed <= tokens + placeholders. N-gram drafts need the sampled tokens on the CPU:
  sync only, as in vLLM.
- Draft trees (`speculative_token_tree`): a request verifies 1 + nodes tokens (all priced), and
  accepts the nodes along one root path, at most the tree's depth; the rest are rejected and
  un-computed like a chain's. A cut row verifies the subtree of its leading nodes.
"""
from __future__ import annotations

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import require
from kernels_cost_model.speculative import verify_step_time
from sim.core.hooks import EngineHook
from sim.core.kv_cache import KVCacheManager
from sim.core.kv_groups import HybridKVCacheManager
from sim.core.request import RequestStatus
from sim.core.scheduler_profiles import get_scheduler_profile
from sim.core.speculative import EAGLE_METHODS, SpeculativeConfig, draft_limit
from workloads.acceptance import accepted_on_tree

STAT_COLUMNS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class SpecDecoder(EngineHook):
    """Proposes drafts, verifies them and records vLLM's spec-decoding counters per step."""

    def __init__(self, config: SpeculativeConfig, acceptance, proposer_cost=None):
        self.config = config
        self.k = config.num_speculative_tokens
        self.acceptance = acceptance          # workloads.acceptance model: num_accepted(...)
        self.proposer_cost = proposer_cost    # kernels_cost_model.speculative.ProposerCost or None
        self.tree = config.tree               # sim.core.token_tree.TokenTree, None for a chain
        self.depth = self.tree.depth if self.tree else self.k
        self.columns: dict[str, list] = {}
        self.caches_after_verify = False      # blocks cached once verified (the profile's, on_attach)

    def on_attach(self, engine) -> None:
        require(not (engine.config.is_async and self.config.method == "ngram"),
                "engine.async_scheduling", True,
                "n-gram drafting runs on the CPU after sampling: vLLM keeps it synchronous; "
                "set async_scheduling to false or pick a GPU proposer")
        profile = get_scheduler_profile(engine.config.scheduler_profile)
        if self.config.method == "draft_model" and hasattr(engine.policy, "draft_slots"):
            engine.policy.draft_slots = 1  # (vLLM's max_num_new_slots_for_drafting: its own slot per row)
            self._check_draft_slots(engine.config, profile)
        kv = engine.state.kv
        kv.num_lookahead_tokens = self.config.num_lookahead_tokens
        kv.max_model_len = engine.config.max_model_len
        kv.admission_lookahead = profile.admission_lookahead
        if hasattr(kv, "add_speculative_state"):  # a hybrid model's state groups: 1 + k states
            kv.add_speculative_state(self.k)
        self.caches_after_verify = profile.caches_after_verify
        if profile.pads_new_decodes and hasattr(engine.policy, "pad_decodes"):
            engine.policy.pad_decodes = 1 + self.k
            self._check_padded_row(engine.config, engine.policy.draft_slots)
        if self.config.method in EAGLE_METHODS:
            kv.drop_last_hit_block = profile.eagle_drops_last_hit_block
            if profile.eagle_hashes_next_token and kv.enable_prefix_caching and type(kv) in (KVCacheManager,
                                                                                              HybridKVCacheManager):
                kv.hash_next_tokens(1)  # (vLLM's num_hash_lookahead_tokens: the EAGLE head reads one ahead)
        names = STAT_COLUMNS + tuple(f"num_accepted_pos_{i + 1}" for i in range(self.depth))
        self.columns = {name: engine.steps.extra.setdefault(name, []) for name in names}
        self.row_drafts: dict[int, list[int]] = {}   # id(step) -> drafts per row, until applied
        self.padded: dict[int, set] = {}             # id(step) -> its admitted requests, until applied
        engine.apply_rows = lambda step, now: self.apply_rows(engine, step, now)

    @staticmethod
    def _check_draft_slots(config, profile) -> None:
        """A budget that leaves a draft model's rows room beside their slots."""
        if profile.release == "0.19":  # (a slot per seat, at once)
            require(config.max_num_batched_tokens > config.max_num_seqs, "engine.max_num_batched_tokens",
                    config.max_num_batched_tokens, f"must exceed max_num_seqs={config.max_num_seqs} with a "
                    "draft model under vLLM 0.19, which takes one drafting slot per seat off the budget")
        require(config.max_num_batched_tokens > 1, "engine.max_num_batched_tokens", config.max_num_batched_tokens,
                "must be at least 2 with a draft model: each row takes a drafting slot beside its tokens")

    def _check_padded_row(self, config, draft_slots: int) -> None:
        """Under `pads_new_decodes` (vLLM 0.33) a one-token admission is padded to 1 + k tokens, and vLLM
        waits rather than schedule it unpadded: a budget that cannot hold that row (and a draft model's
        slot) leaves such a request waiting for good."""
        width = 1 + self.k + draft_slots
        require(config.max_num_batched_tokens >= width, "engine.max_num_batched_tokens",
                config.max_num_batched_tokens,
                f"must be at least {width} with {self.k} speculative tokens"
                f"{' and a draft model slot' if draft_slots else ''} under vLLM 0.33, which pads a waiting "
                f"request with one token to compute to a {1 + self.k}-token decode row and waits rather than "
                "schedule it unpadded")

    def on_plan(self, engine, step) -> None:
        """Price the verification rows, the drafts' logits rows and the proposer's passes; under
        async scheduling, leave each sampling row's placeholders and next drafts."""
        scheduled = step.plan.scheduled
        per_row = [num_drafts(req, n) for req, n in scheduled]
        self.row_drafts[id(step)] = per_row
        for (req, _n), samples in zip(scheduled, step.samples):
            req.is_prefill_chunk = not samples
        # an admitted row's drafts are padding (`Policy._padded_decode`): placeholders, all rejected
        self.padded[id(step)] = set(step.plan.admitted) if step.plan.admitted else ()
        drafts = sum(per_row)
        batch, cost = step.batch, engine.cost_model
        target = step.duration
        if drafts:
            step.batch = BatchShape(batch.num_new_tokens, batch.num_context_tokens,
                                    batch.num_sampled + drafts)
            target = verify_step_time(cost, step.batch, per_row)
            step.duration += target - cost.step_time(batch)
        if self.proposer_cost is not None and batch.num_sampled:
            proposing = [req.num_computed_tokens + n for (req, n), samples in zip(scheduled, step.samples)
                         if samples]
            step.duration += self.proposer_cost(step.batch, proposing, target, per_row)
        if engine.config.is_async:
            self._leave_placeholders(engine, step, per_row)

    def _leave_placeholders(self, engine, step, per_row: list[int]) -> None:
        """AsyncScheduler._update_after_schedule: a sampling row's drafts become placeholders (the
        engine adds the sampled token's) and the next step gets all k placeholder drafts; the
        scheduler's max_model_len cap (on the optimistic computed tokens) trims them when it
        schedules that step, as vLLM's does."""
        for (req, _n), samples, drafts in zip(step.plan.scheduled, step.samples, per_row):
            if samples:
                req.num_output_placeholders += drafts  # (tokens in flight already: not counted twice)
                req.num_in_flight_extra -= drafts
                req.num_spec_tokens = self.k

    def apply_rows(self, engine, step, now: float) -> list:
        """Verify each sampling row's drafts; emit accepted tokens + bonus through the stop rules.

        The engine counted the scheduled tokens, drafts included, as computed when it planned the
        step; rejected drafts come off again (not for a row planned before its request was
        preempted: that one's counts were reset, only its tokens still arrive)."""
        finished = []
        streams, max_model_len = engine.streams, engine.config.max_model_len
        async_, kv = engine.config.is_async, engine.state.kv
        counts = [0] * (3 + self.depth)
        num_decode = 0
        rows = zip(step.plan.scheduled, step.samples, self.row_drafts.pop(id(step)))
        padded = self.padded.pop(id(step))
        for (req, n), samples, drafts in rows:
            req.num_in_flight_extra -= n  # (less the placeholders: those cleared below move back)
            stale = req.num_stale_tokens > 0
            if stale:
                req.num_stale_tokens -= n
            if req.is_finished:
                continue                         # aborted or stopped while the step ran
            if not samples:                      # a prefill chunk short of the end: no sample
                if not async_:
                    req.num_spec_tokens = 0
                continue
            if n - drafts == 1 and req.output_token_ids:
                num_decode += n                  # a decode row: 1 + drafts verification tokens
            position = len(req.output_token_ids)
            accepted = self._accepted(req.index, position, drafts) if drafts and req not in padded else 0
            if not stale:
                req.num_computed_tokens -= drafts - accepted   # rejected: un-computed, slots kept
                if async_:
                    req.num_output_placeholders -= 1 + drafts
                    req.num_in_flight_extra += 1 + drafts
            _count(counts, drafts, accepted)
            stream = streams[req.index]
            stopped = engine.emit_step(req, stream, position, accepted + 1, now)
            if stopped:
                finished.append(req)             # tokens after the stop are dropped (most profiles)
                req.num_spec_tokens = 0
            elif not async_:
                req.num_spec_tokens = draft_limit(req, self.k, max_model_len, 0, self.tree)
            if not async_:
                if self.caches_after_verify:     # (a stopped request's too, before its blocks are freed)
                    kv.cache_full_blocks(req, min(req.num_computed_tokens, req.num_tokens))
            elif not stopped and not stale and req.status == RequestStatus.RUNNING:
                kv.cache_full_blocks(req, min(req.num_computed_tokens - req.num_in_flight_tokens,
                                              req.num_tokens))
        step.num_decode = num_decode
        for column, value in zip(self.columns.values(), counts):
            column.append(value)
        return finished

    def _accepted(self, index: int, position: int, drafts: int) -> int:
        """Drafts accepted: a prefix of a chain, or the nodes of one root path of a tree."""
        if self.tree is None:
            return self.acceptance.num_accepted(index, position, drafts)
        return accepted_on_tree(self.acceptance, index, position, self.tree, drafts,
                                self.config.tree_sibling_decay)


def num_drafts(req, n: int) -> int:
    """Draft positions among the `n` tokens scheduled for `req` (0 for a prefill chunk): those
    past its tokens and the placeholders of steps in flight."""
    return max(0, req.num_computed_tokens + n - req.num_tokens - req.num_output_placeholders)


def _count(counts: list, drafts: int, accepted: int) -> None:
    """Add one verification to the step's counters (vLLM's SpecDecodingStats)."""
    if not drafts:
        return
    counts[0] += 1
    counts[1] += drafts
    counts[2] += accepted
    for i in range(accepted):
        counts[3 + i] += 1
