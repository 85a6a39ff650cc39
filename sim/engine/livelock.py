"""A named error where an engine spins for good instead of a run that never ends.

vLLM's scheduler can spin: every running request is preempted with nothing scheduled, the head of the
waiting queue is admitted again and grows into the same wall, while waiting requests hold the blocks it
needs (their prefix loaded from a CPU tier, or their KV received from a prefill instance). Nothing in
the engine changes that cycle; only an event from outside it (an arrival, an abort, a transfer landing)
can. servesim runs the same cycle step for step, so such a run used to never return.

The watch names the livelock only when nothing but the engine's own steps is scheduled in the
simulation, the requests' state (every live request's progress and blocks, the waiting order, the free
count) has come back at preempt-only plans in a row, and the engine's state with the free-block queue in
order has repeated exactly (the queue may take several cycles to come back). A hook's own state (a CPU
tier's contents) is not compared. It costs nothing on other steps: the engine calls it only from a plan
that scheduled nothing, preempted something and left nothing running.
"""
from __future__ import annotations

from kernels_cost_model.errors import ConfigError

#: consecutive preempt-only plans with the same request state before the full state is compared
RECURRENCES = 2
#: full states kept while the request state recurs (the free-block queue may cycle through several)
MAX_DIGESTS = 64


class SpinWatch:
    """Counts consecutive preempt-only plans that find the engine's requests as the last one did."""

    __slots__ = ("last", "recurrences", "digests")

    def __init__(self):
        self.last = None
        self.recurrences = 0
        self.digests: set = set()

    def recurred(self, engine) -> bool:
        """Note a plan that preempted every running request and scheduled nothing; whether the requests'
        state has now come back `RECURRENCES` times in a row."""
        state = request_state(engine)
        if state == self.last:
            self.recurrences += 1
        else:
            self.last, self.recurrences = state, 0
            self.digests.clear()
        return self.recurrences >= RECURRENCES

    def repeats_exactly(self, engine) -> bool:
        """Whether the full state (`full_digest`) is one this has seen since the request state recurred
        (the free-block queue's order may cycle with a period of several plans)."""
        digest = full_digest(engine)
        if digest in self.digests:
            return True
        if len(self.digests) >= MAX_DIGESTS:
            self.digests.clear()
        self.digests.add(digest)
        return False


def request_state(engine) -> tuple:
    """Every live request's status, progress and blocks held; the engine's arrival and finish counts."""
    kv = engine.state.kv
    return (len(engine.requests), len(engine.by_id), kv.num_free_blocks,
            tuple((r.request_id, r.status, r.num_computed_tokens, r.num_tokens, r.num_output_placeholders,
                   tuple(kv.blocks_of(r))) for r in engine.by_id.values()),
            tuple(r.request_id for r in engine.state.waiting))


def full_digest(engine) -> tuple:
    """`request_state` plus the free-block queue in order and the prefix cache's size (what decides which
    blocks the next allocation takes and which hits it finds)."""
    kv = engine.state.kv
    return request_state(engine), tuple(kv.free_queue), kv.num_cached_hashes


def only_own_events(env, processes) -> bool:
    """Whether every event scheduled in `env` resumes one of `processes` (the engine's own steps) or
    nobody (a finished process's end): then nothing from outside the engine can happen. Reads SimPy's
    event queue (`Environment._queue`, a heap of (time, priority, id, event))."""
    return all(all(getattr(callback, "__self__", None) in processes for callback in event.callbacks or ())
               for *_, event in env._queue)


def check_livelock(env, processes, engine) -> None:
    """Called when `engine`'s requests recurred at a preempt-only plan (`SpinWatch.recurred`): the named
    error once nothing but `processes` (those that run the engine's steps) is scheduled in `env` and the
    engine's full state repeats exactly."""
    if only_own_events(env, processes) and engine.spin_watch.repeats_exactly(engine):
        raise livelock_error(engine)


def livelock_error(engine) -> ConfigError:
    """The named error: the spinning head, the free blocks, and the waiting requests that hold blocks."""
    kv, state = engine.state.kv, engine.state
    head = state.waiting[0].request_id if state.waiting else None
    holders = {r.request_id: len(kv.blocks_of(r)) for r in engine.by_id.values()
               if r not in state.running and kv.blocks_of(r)}
    return ConfigError("engine.num_gpu_blocks", kv.num_gpu_blocks,
                       f"the engine livelocked: every running request is preempted with nothing scheduled and "
                       f"the same state comes back step after step with nothing else left to happen; the head "
                       f"{head} is admitted again and outgrows the {kv.num_free_blocks} free blocks while "
                       f"{len(holders)} request(s) not running hold {sum(holders.values())} blocks "
                       f"({', '.join(f'{k}: {v}' for k, v in list(holders.items())[:4])}; KV loaded from a CPU "
                       "tier or received from a prefill instance). vLLM's scheduler spins there for good. "
                       "Give the GPU more KV blocks")
