"""Engine hooks: how a feature adds work to a step or holds back a completion without new
branches in the engine.

An engine runs its hooks (`Engine(..., hooks=[...])`, in order) at these points; with no hooks the
engine does exactly what it did without them:

- `on_attach(engine)`: once, when the engine is built. A hook may set engine-wide state or take
  over the token update of a step's rows (`engine.apply_rows(step, now) -> finished requests`;
  speculative decoding verifies drafts there).

- `on_plan(engine, step)`: the step is scheduled and priced. A hook may add work to it: replace
  `step.batch` with a wider one and/or add seconds to `step.duration` (add a delta; other hooks
  may have added theirs).
- `on_stop(engine, req, now) -> bool`: `req` stopped at the end of a step (EOS, stop ids or
  strings, length). True defers its completion: the engine frees its KV blocks now but records
  the finish (finish time, the client's answer) only when the hook calls `engine.complete(req,
  now)`. The first hook that returns True owns the request.
- `on_step_end(engine, now)`: the step's stops are applied (before its pending aborts).
- `has_work()`: the hook has work that needs a step (e.g. a deferred completion); the engine
  keeps stepping, even with nothing scheduled, until it is done.
"""
from __future__ import annotations


class EngineHook:
    """Base class with do-nothing defaults; override what a feature needs."""

    def on_attach(self, engine) -> None:
        """The engine was built with this hook (set engine-wide state, e.g. KV lookahead slots, or
        replace `engine.apply_rows`, the token update of a step's rows)."""

    def has_work(self) -> bool:
        return False

    def on_plan(self, engine, step) -> None:
        """Add work to the planned `step` (its batch and duration)."""

    def on_stop(self, engine, req, now: float) -> bool:
        """`req` stopped; True defers its completion until the hook calls `engine.complete`."""
        return False

    def on_step_end(self, engine, now: float) -> None:
        """The step's results are applied."""
