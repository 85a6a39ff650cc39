"""Multi-turn and agentic conversations replayed closed-loop, and their importers.

A `Conversation` is a start time and turns; each turn is a request and the tool (or think) time
before it. `ConversationReplay` submits a conversation's first turn at its start and every later
turn once the previous answer has finished plus that turn's gap, so answers that come back later
push the next turns later, as an agent waiting on the model would.

Importers:
- `mooncake_conversations(path)`: a Mooncake FAST'25 prefix-hash trace. A request whose hash ids
  start with all full blocks (all but the last) of an earlier conversation's latest request, at
  least MIN_SHARED_BLOCKS of them, continues that conversation; the gap before it is
  the trace's time between the two arrivals (the original answer time is not in the trace, so this
  is an upper bound on the tool/think time). Prompts are the hash ids' blocks, so turns share prefixes.
- `otel_genai_conversations(path)` (workloads.otel_genai): OpenTelemetry GenAI spans.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kernels_cost_model.errors import require
from sim.core.sampling_params import SamplingParams
from workloads.spec import RequestSpec
from workloads.tokens import block_tokens
from workloads.traces import read_mooncake


#: Blocks a later turn must share with an earlier one to continue it (block 0 is a system prompt
#: many unrelated requests share, so one block is not enough).
MIN_SHARED_BLOCKS = 2


@dataclass(frozen=True)
class Turn:
    """One request of a conversation and the tool/think time between the previous answer and it."""

    spec: RequestSpec
    gap_s: float = 0.0

    def __post_init__(self) -> None:
        require(self.gap_s >= 0, "gap_s", self.gap_s, "must be >= 0")


@dataclass(frozen=True)
class Conversation:
    session_id: str
    start_s: float
    turns: tuple[Turn, ...]


class ConversationReplay:
    """Closed-loop workload over conversations (request ids `<session>-t<k>`)."""

    def __init__(self, conversations: list[Conversation]):
        require(len(conversations) > 0, "conversations", len(conversations), "need at least one")
        self.conversations = sorted(conversations, key=lambda c: (c.start_s, c.session_id))

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def process(self, env, submit, rng: np.random.Generator):
        def run(c: Conversation):
            yield env.timeout(c.start_s)
            for k, turn in enumerate(c.turns):
                if turn.gap_s:
                    yield env.timeout(turn.gap_s)
                yield submit(replace(turn.spec, arrival_time_s=env.now, request_id=f"{c.session_id}-t{k}",
                                     session_id=c.session_id))

        yield env.all_of([env.process(run(c)) for c in self.conversations])


def mooncake_conversations(path: str | Path, max_requests: int | None = None, ignore_eos: bool = True,
                           time_scale: float = 1.0) -> list[Conversation]:
    """Conversations from a Mooncake prefix-hash trace (first `max_requests` rows). `time_scale`
    stretches start times and gaps (10: a tenth of the trace's traffic, e.g. one of ten instances)."""
    require(math.isfinite(time_scale) and time_scale > 0, "time_scale", time_scale, "must be a finite number > 0")
    rows = list(itertools.islice(read_mooncake(path), max_requests))
    chains: list[list] = []                  # rows of each conversation
    tip: dict[tuple, int] = {}               # hash ids of a conversation's last turn -> conversation
    for row in rows:
        ids = tuple(row.hash_ids)
        owner = next((tip.pop(ids[:k]) for k in range(len(ids), MIN_SHARED_BLOCKS - 1, -1) if ids[:k] in tip), None)
        if owner is None:
            owner = len(chains)
            chains.append([])
        chains[owner].append(row)
        if len(ids) > MIN_SHARED_BLOCKS:
            tip[ids[:-1]] = owner    # its full blocks: the last one is partial unless the next turn repeats it
    return [_conversation(f"mc{i}", chain, ignore_eos, time_scale) for i, chain in enumerate(chains)]


def _conversation(session_id: str, rows: list, ignore_eos: bool, time_scale: float) -> Conversation:
    turns, previous = [], rows[0].arrival_s
    for row in rows:
        prompt = block_tokens(row.hash_ids, row.prompt_len, row.block_size)
        output = max(1, row.output_len)
        spec = RequestSpec(0.0, prompt, output_len=output, sampling_params=SamplingParams(max_tokens=output, ignore_eos=ignore_eos))
        turns.append(Turn(spec, (row.arrival_s - previous) * time_scale))
        previous = row.arrival_s
    return Conversation(session_id, rows[0].arrival_s * time_scale, tuple(turns))
