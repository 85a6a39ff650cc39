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
- Cost: the verification rows are already priced as 1 + drafts query tokens by the cost model;
  this hook adds the drafts' LM-head rows (logits for every verified position) and the
  proposer's time (`kernels_cost_model.speculative.ProposerCost`).
- KV: EAGLE / MTP / draft-model proposers reserve k lookahead slots per allocation.
- Scheduling is synchronous (each step's tokens are applied before the next is planned); vLLM's
  async scheduling with drafts as placeholders is not modelled.
"""
from __future__ import annotations

from kernels_cost_model.batch import BatchShape
from kernels_cost_model.errors import require
from sim.core.hooks import EngineHook
from sim.core.speculative import SpeculativeConfig, draft_limit

STAT_COLUMNS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class SpecDecoder(EngineHook):
    """Proposes drafts, verifies them and records vLLM's spec-decoding counters per step."""

    def __init__(self, config: SpeculativeConfig, acceptance, proposer_cost=None):
        self.config = config
        self.k = config.num_speculative_tokens
        self.acceptance = acceptance          # workloads.acceptance model: num_accepted(...)
        self.proposer_cost = proposer_cost    # kernels_cost_model.speculative.ProposerCost or None
        self.columns: dict[str, list] = {}

    def on_attach(self, engine) -> None:
        require(not engine.config.is_async, "engine.async_scheduling", True,
                "speculative decoding is modelled with synchronous scheduling; set it to false")
        engine.strings_in_frontend = False  # modelled in the engine: a stop ends the verify step's run
        kv = engine.state.kv
        kv.num_lookahead_tokens = self.config.num_lookahead_tokens
        kv.max_model_len = engine.config.max_model_len
        names = STAT_COLUMNS + tuple(f"num_accepted_pos_{i + 1}" for i in range(self.k))
        self.columns = {name: engine.steps.extra.setdefault(name, []) for name in names}
        engine.apply_rows = lambda step, now: self.apply_rows(engine, step, now)

    def on_plan(self, engine, step) -> None:
        """Price the drafts' logits rows and the proposer's passes after this step's target pass."""
        scheduled = step.plan.scheduled
        drafts = sum(num_drafts(req, n) for req, n in scheduled)
        batch, cost = step.batch, engine.cost_model
        if drafts:
            step.batch = BatchShape(batch.num_new_tokens, batch.num_context_tokens,
                                    batch.num_sampled + drafts)
            step.duration += cost.step_time(step.batch) - cost.step_time(batch)
        if self.proposer_cost is not None and batch.num_sampled:
            proposing = [req.num_computed_tokens + n for req, n in scheduled
                         if req.num_computed_tokens + n >= req.num_tokens]
            step.duration += self.proposer_cost(step.batch, proposing, cost.step_time(step.batch))

    def apply_rows(self, engine, step, now: float) -> list:
        """Verify each sampling row's drafts; emit accepted tokens + bonus through the stop rules.

        The engine counted the scheduled tokens, drafts included, as computed when it planned the
        step (synchronous scheduling: nothing else was in flight)."""
        finished = []
        streams, max_model_len = engine.streams, engine.config.max_model_len
        counts = [0] * (3 + self.k)
        num_decode = 0
        for (req, n), samples in zip(step.plan.scheduled, step.samples):
            req.num_in_flight_tokens -= n
            if req.is_finished:
                continue                         # aborted while the step ran
            if not samples:                      # a prefill chunk short of the end: no sample
                req.num_spec_tokens = 0
                continue
            num_tokens = req.num_tokens
            if num_tokens - (req.num_computed_tokens - n) == 1 and req.output_token_ids:
                num_decode += n                  # a decode row: 1 + drafts verification tokens
            drafts = req.num_computed_tokens - num_tokens
            position = len(req.output_token_ids)
            accepted = self.acceptance.num_accepted(req.index, position, drafts) if drafts else 0
            req.num_computed_tokens -= drafts - accepted   # rejected: un-computed, slots kept
            _count(counts, drafts, accepted)
            stream = streams[req.index]
            if any(engine.emit_token(req, stream(position + j), now) for j in range(accepted + 1)):
                finished.append(req)             # tokens after the stop are dropped
                req.num_spec_tokens = 0
            else:
                req.num_spec_tokens = draft_limit(req, self.k, max_model_len)
        step.num_decode = num_decode
        for column, value in zip(self.columns.values(), counts):
            column.append(value)
        return finished


def num_drafts(req, n: int) -> int:
    """Draft positions among the `n` tokens scheduled for `req` (0 for a prefill chunk)."""
    return max(0, req.num_computed_tokens + n - req.num_tokens)


def _count(counts: list, drafts: int, accepted: int) -> None:
    """Add one verification to the step's counters (vLLM's SpecDecodingStats)."""
    if not drafts:
        return
    counts[0] += 1
    counts[1] += drafts
    counts[2] += accepted
    for i in range(accepted):
        counts[3 + i] += 1
