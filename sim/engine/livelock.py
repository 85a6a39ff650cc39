"""A named error where an engine spins for good instead of a run that never ends.

vLLM's scheduler can spin: every running request is preempted with nothing scheduled, the head of the
waiting queue is admitted again and grows into the same wall, while waiting requests hold the blocks it
needs (their prefix loaded from a CPU tier, or their KV received from a prefill instance). Nothing in
the engine changes that cycle; only an event from outside it (an arrival, an abort, a transfer landing)
can. servesim runs the same cycle step for step, so such a run used to never return. (A disaggregated
prefill instance under PP, which servesim plans without its requests in flight, can spin too: the
visible requests take turns preempting themselves while those in flight hold the blocks.)

The watch names the livelock only when nothing but the engine's own steps is scheduled in the
simulation, the requests' state (every live request's progress and blocks, the waiting order, the free
count) has come back at recent preempt-only plans, and the engine's state with the free-block queue in
order (and the batches in flight, under PP) has repeated exactly: the cycle may take several plans (the
victims taking turns, the queue's order coming back). A hook's own state (a CPU tier's contents) is not
compared. It costs nothing on other steps: the engine calls it only from a plan that scheduled nothing,
preempted something and left nothing running.
"""
from __future__ import annotations

from weakref import WeakKeyDictionary

from kernels_cost_model.errors import ConfigError

#: times a request state must have been seen among the recent preempt-only plans before the full
#: state is compared
RECURRENCES = 3
#: preempt-only plans remembered (a cycle of victims taking turns is at most this long)
WINDOW = 1024
#: full states remembered (the free-block queue may take several cycles to come back)
MAX_DIGESTS = 1024


class SpinWatch:
    """Remembers the request states of recent preempt-only plans and, once one recurs, full states."""

    __slots__ = ("seen", "digests")

    def __init__(self):
        self.seen: dict = {}      # request state -> times seen (insertion order: oldest first)
        self.digests: dict = {}   # full states seen (a dict for its insertion order)

    def recurred(self, engine) -> bool:
        """Note a plan that preempted every running request and scheduled nothing; whether the requests'
        state has now been seen `RECURRENCES` times among the last `WINDOW` such plans."""
        state = request_state(engine)
        count = self.seen.pop(state, 0) + 1
        self.seen[state] = count
        if len(self.seen) > WINDOW:
            del self.seen[next(iter(self.seen))]
        return count >= RECURRENCES

    def repeats_exactly(self, engine, extra=()) -> bool:
        """Whether the full state (`full_digest`, with `extra`: the process's own, e.g. its batches in
        flight) is one seen before; remembers it."""
        digest = full_digest(engine), extra
        if digest in self.digests:
            return True
        if len(self.digests) >= MAX_DIGESTS:
            del self.digests[next(iter(self.digests))]
        self.digests[digest] = None
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


def check_livelock(env, process, engine) -> None:
    """Called when `engine`'s requests recurred at a preempt-only plan (`SpinWatch.recurred`): the named
    error once the engine's full state, with `process.own_state()`, repeats exactly and nothing is
    scheduled in `env` but the steps of this engine (`process.own_processes()`) and of engines whose own
    state repeated too with no request in or out since (two instances of a disaggregated run may spin
    at once, each one's steps queued beside the other's: neither can change the other's cycle)."""
    spinning = _SPINNING.setdefault(env, {})
    if not engine.spin_watch.repeats_exactly(engine, process.own_state()):
        spinning.pop(process, None)
        return
    spinning[process] = inputs_of(engine)
    others = [p for p, inputs in spinning.items() if p is not process and inputs_of(p.engine) == inputs]
    if only_own_events(env, set(process.own_processes()).union(*(p.own_processes() for p in others))):
        raise livelock_error(engine, process.blocks_field, process.spin_cause())


def inputs_of(engine) -> tuple:
    """Changes whenever a request enters or leaves the engine (arrivals only add to `requests`)."""
    return len(engine.requests), len(engine.by_id)


#: per SimPy environment, the processes whose engine's state last repeated exactly, with its `inputs_of`
_SPINNING: WeakKeyDictionary = WeakKeyDictionary()


def livelock_error(engine, field: str, cause: str) -> ConfigError:
    """The named error: the requests that hold blocks without running, and why the engine spins."""
    kv, state = engine.state.kv, engine.state
    holders = {r.request_id: len(kv.blocks_of(r)) for r in engine.by_id.values()
               if r not in state.running and kv.blocks_of(r)}
    held = ", ".join(f"{k}: {v}" for k, v in list(holders.items())[:4])
    head = state.waiting[0].request_id if state.waiting else None
    return ConfigError(field, kv.num_gpu_blocks,
                       f"the engine livelocked: every running request is preempted with nothing scheduled and "
                       f"the same state comes back with nothing else left to happen (waiting head {head}, "
                       f"{kv.num_free_blocks} blocks free; {len(holders)} request(s) not running hold "
                       f"{sum(holders.values())} blocks{': ' + held if held else ''}); {cause}. Give the GPU more "
                       "KV blocks")


#: why an engine spins, as `EngineProcess.spin_cause` says it
HOLDERS_CAUSE = ("the waiting head is admitted again and outgrows the free blocks while requests that do not "
                 "run hold blocks (KV loaded from a CPU tier or received from a prefill instance); vLLM's "
                 "scheduler spins there for good")
HIDDEN_IN_FLIGHT_CAUSE = ("servesim plans this disaggregated prefill instance under pipeline parallelism without "
                          "its requests in flight, so the visible ones preempt themselves in turn while those in "
                          "flight hold the blocks (vLLM would preempt a request in flight)")
