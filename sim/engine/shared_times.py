"""Token times shared by a whole step (fast mode): a step that times every running request at once.

A step whose plan scheduled every running request (`Step.covers_running`) gives each row that samples
its token at the step's end, the same time for all. Rather than append that time to every row's list,
the step takes a *slot* when planned; its end time is written there when it finishes, and a running
request's list is owed the slots from its *mark* on. The owed times are copied into the list
(`catch_up`) before anything else reads or extends it: the request's finish, a preemption, a token
of a step without a slot, the run's records. A leap's units take slots too (`stretch`). A row of a
slotted step that gets no token there (stale, stopped, mid-prefill, finished for its client) moves
its mark past the slot (`skip`).

Slots are written in the order they were taken (steps finish in the order planned); a request not
running owes nothing (`NOTHING_OWED`). Every time copied is the float the step ended at, so the lists
hold the same values, in the same order, as when each row appended its own.
"""
from __future__ import annotations

from itertools import repeat

NOTHING_OWED = 1 << 62  # the mark of a request that is owed no slot (not running)
COMPACT_EVERY = 4096    # slots written between drops of the times no running request is owed


class SharedTimes:
    """The slots of one engine's steps that time all their rows at once."""

    def __init__(self):
        self.times: list[float] = []  # end times of the slots written, from slot `base` on
        self.base = 0
        self.written = 0   # slots written (the next to write)
        self.taken = 0     # slots taken by planned steps
        self.compact_at = COMPACT_EVERY  # written slots at which to drop the times no one is owed

    def take(self) -> int:
        """A slot for a step being planned."""
        slot = self.taken
        self.taken = slot + 1
        return slot

    def write(self, slot: int, now: float, running: list) -> None:
        """The step holding `slot` ended at `now`."""
        if slot != self.written:
            raise RuntimeError(f"step time slot {slot} finished out of order (next is {self.written})")
        self.times.append(now)
        self._written(slot + 1, running)

    def write_run(self, first: int, ends: list, running: list) -> None:
        """The steps holding slots `first`, `first` + 1, ... ended at `ends` (`write` for each, in one move)."""
        if first != self.written:
            raise RuntimeError(f"step time slot {first} finished out of order (next is {self.written})")
        self.times.extend(ends)
        self._written(first + len(ends), running)

    def join(self, req) -> None:
        """`req` starts running: owed the slots of steps planned from now on."""
        req.times_mark = self.taken

    def catch_up(self, req, times: list, end: int | None = None) -> None:
        """Copy into `times` (req's token times) the written slots it is owed (before slot `end`)."""
        mark = req.times_mark
        if end is None:
            end = self.written
        if mark < end:
            base = self.base
            times.extend(self.times[mark - base:end - base])
            req.times_mark = end

    def skip(self, req, times: list, slot: int) -> None:
        """`req` got no token at the end of the step holding `slot` (written): owed what came before."""
        if req.times_mark <= slot:
            if times is not None:
                self.catch_up(req, times, slot)
            req.times_mark = slot + 1

    def leave(self, req, times: list | None) -> None:
        """`req` stops running (finished or preempted): copy what it is owed; it is owed nothing more
        (a token of a step planned before it left lands as any other row's: `skip`, then its own)."""
        if times is not None:
            self.catch_up(req, times)
        req.times_mark = NOTHING_OWED

    def stretch(self, rows: list, token_times: list, in_flight, ends: list, skips: list | None) -> None:
        """A leap's units (ending at `ends`) over `rows` (every running request) timed by slots, one a
        unit. Unit 1 finishes the step `in_flight` (under async scheduling; a leap starts with no other
        step in flight): its slot, the only one taken and not written; where it has none (it did not
        schedule every row), the rows in it append unit 1's time themselves (a row that skips unit 1
        is not in it, or does not sample there)."""
        first = None if in_flight is None else in_flight.time_slot
        outstanding = tuple(range(self.written, self.taken))  # slots taken, not written
        if outstanding != (() if first is None else (first,)):
            raise RuntimeError(f"a leap from step time slot {first} with slots {outstanding} taken and not written")
        if first is None:
            if in_flight is not None:  # unit 1 times the rows of the step in flight
                self._time_own(rows, token_times, ends[0], skips)
                ends = ends[1:]
        elif skips is not None:
            for req, skip in zip(rows, skips):
                if skip:
                    self.skip(req, token_times[req.index], first)
        self._write_run(ends, rows)

    def _write_run(self, ends: list, running: list) -> None:
        """Write the slot taken and not written, if any, and as many new ones after it as `ends`
        has times left, in one move."""
        self.times.extend(ends)
        self._written(self.written + len(ends), running)
        if self.taken < self.written:
            self.taken = self.written

    def _written(self, written: int, running: list) -> None:
        """Slots up to `written` are written; every `COMPACT_EVERY` of them, the times no running
        request is owed go."""
        self.written = written
        if written >= self.compact_at:
            self.compact_at = written + COMPACT_EVERY
            self._compact(running)

    def _time_own(self, rows: list, token_times: list, end: float, skips: list | None) -> None:
        """The rows that do not skip (`skips`) append `end` themselves, having caught up."""
        written, base, slots = self.written, self.base, self.times
        for req, skip in zip(rows, skips or repeat(0)):
            if not skip:
                times = token_times[req.index]
                if times is not None:
                    mark = req.times_mark
                    if mark < written:  # (`catch_up` inline)
                        times.extend(slots[mark - base:written - base])
                        req.times_mark = written
                    times.append(end)

    def _compact(self, running: list) -> None:
        """Drop the times before the least mark of the running requests."""
        least = min((req.times_mark for req in running), default=self.written)
        least = min(least, self.written)
        if least > self.base:
            del self.times[:least - self.base]
            self.base = least
