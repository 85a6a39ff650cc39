"""A planned engine step: what the scheduler gave, its batch shape, its duration."""
from __future__ import annotations

from dataclasses import dataclass, field

from kernels_cost_model.batch import BatchShape
from policies.base import SchedulerOutput


@dataclass(slots=True)
class Step:
    """A planned step: the scheduler's output, its batch shape and its duration.

    `samples[i]`: row i catches up with its tokens, so it samples one (the catch-up rule, counting
    tokens still in flight under async scheduling as known).
    """

    plan: SchedulerOutput
    batch: BatchShape
    duration: float
    start: float
    num_decode: int  # decode rows (1 token, request already has outputs), counted at the step's end
    samples: list = field(default_factory=list)
    #: its plan scheduled every running request (`Engine.plan_step`): while it is in flight, each of
    #: them has a token in flight (False where not known: a leap's steps)
    covers_running: bool = False
    #: its slot of shared token times (sim.engine.shared_times), or None: each row times its own token
    time_slot: int | None = None
    #: every row is a one-token decode that samples (the plan's `num_decodes`) and no hook may have widened
    #: the batch (sim.whatif.last_token adds rows): its rows count its tokens, samples and decodes
    all_decodes: bool = False
