"""Invariants as code: run after every step in tests and under `check_invariants=True`."""
from __future__ import annotations

from collections import Counter

from kernels_cost_model.model_shapes import CHUNKED

from sim.core.request import Request


class InvariantError(AssertionError):
    """The engine reached a state that must never happen."""


def _ensure(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantError(message)


def check_invariants(engine) -> None:
    """KV blocks conserved and never double-owned; queues consistent; budgets respected."""
    state, kv, config = engine.state, engine.state.kv, engine.config
    _check_kv(kv)
    running, waiting = state.running, list(state.waiting)
    _ensure(len(running) <= config.max_num_seqs,
            f"{len(running)} running requests exceed max_num_seqs={config.max_num_seqs}")
    _ensure(not set(map(id, running)) & set(map(id, waiting)), "a request is both running and waiting")
    for req in running + waiting:
        _ensure(not req.is_finished, f"finished request {req.request_id} still queued")
        _check_in_flight(req, engine.steps_in_flight)
    groups = getattr(kv, "groups", None)
    for req in running:
        if groups:
            _check_groups(kv, req)
        else:
            blocks = kv.blocks_of(req)
            needed = -(-req.num_computed_tokens // kv.block_size)
            _ensure(len(blocks) >= needed,
                    f"{req.request_id} has {len(blocks)} blocks for {req.num_computed_tokens} computed tokens")
            _check_grow_bound(kv, req, blocks)
        _ensure(req.num_computed_tokens <= req.num_tokens + req.num_output_placeholders,
                f"{req.request_id} computed past its tokens and placeholders")
    for req in kv.req_blocks:
        _ensure(req.status.name == "RUNNING" or kv.holds_outside_queues(req),
                f"{req.request_id} holds KV while {req.status.name}")


def _check_in_flight(req, steps_in_flight: int) -> None:
    """A queued request's placeholders are among its tokens in flight (`Request.num_in_flight_extra`
    is what is left), and with no step in flight it has neither."""
    _ensure(req.num_in_flight_extra >= 0, f"{req.request_id}: fewer tokens in flight than placeholders")
    if not steps_in_flight:
        _ensure(not req.num_in_flight_tokens, f"{req.request_id}: tokens in flight with no step in flight")
        _ensure(not req.num_stale_tokens, f"{req.request_id}: stale tokens with no step in flight")


def _check_grow_bound(kv, req, blocks: list) -> None:
    """`req.kv_grow_at` (0: none) is no higher than the token count that takes a block or, with
    registration bounded by `kv_register_at`, fills one to register; with the exact check, none."""
    bound = req.kv_grow_at
    if not bound:
        return
    _ensure(bound <= len(blocks) * kv.block_size + 1, f"{req.request_id}: kv_grow_at {bound} past its blocks")
    if kv.enable_prefix_caching:
        _ensure(kv.registers_at, f"{req.request_id}: kv_grow_at {bound} with exact registration checks")
        full = (kv.num_hashed_blocks.get(req, 0) + 1) * kv.block_size
        _ensure(bound <= full, f"{req.request_id}: kv_grow_at {bound} past its next full block ({full})")


def _check_kv(kv) -> None:
    """Work proportional to the blocks (every free block is read), so it can run after every step."""
    owners = Counter(b for blocks in kv.req_blocks.values() for b in blocks)
    free = set(kv.free_queue)
    _ensure(len(owners) + len(kv.free_queue) == kv.num_usable_blocks,
            f"{len(owners)} owned + {len(kv.free_queue)} free blocks != {kv.num_usable_blocks} usable")
    _ensure(0 not in owners and 0 not in free, "the null block (0) was handed out")
    _ensure(len(free) == len(kv.free_queue), "a block is in the free queue twice")
    for block, count in owners.items():
        _ensure(kv.ref_cnt[block] == count,
                f"block {block}: ref_cnt {kv.ref_cnt[block]} but {count} owners")
        _ensure(block not in free, f"block {block} is owned and free at once")
    for req, blocks in kv.req_blocks.items():
        _ensure(len(blocks) == len(set(blocks)), f"{req.request_id} holds a block twice")
    if getattr(kv, "lazy", None) is not None:
        _check_marked(kv)


def _check_marked(kv) -> None:
    """Deferred registration (sim.core.kv_lazy): a private request's blocks are its marked ones (their
    `block_hash` entry is the request), then ones holding nothing; the blocks marked for each request are
    as many as its count of resident ones, and all of them as the manager's."""
    marked = Counter(h for h in kv.block_hash if type(h) is Request)
    _ensure(sum(marked.values()) == kv.lazy_blocks,
            f"{sum(marked.values())} marked blocks but lazy_blocks {kv.lazy_blocks}")
    for req, blocks in kv.req_blocks.items():  # (marking skips the check that a block holds nothing)
        if req.kv_lazy:
            done = kv.num_hashed_blocks.get(req, 0)
            _ensure(all(kv.block_hash[b] is req for b in blocks[:done])
                    and all(kv.block_hash[b] is None for b in blocks[done:]),
                    f"{req.request_id}: a private request's blocks are not its marked ones, then unmarked ones")
    tracked = {req for holders in kv.lazy.holders.values() for req in holders}
    for req in tracked | set(marked):
        _ensure(req in tracked and (req.kv_lazy or not marked[req]) and req.kv_lazy_resident == marked[req],
                f"{req.request_id}: {marked[req]} marked blocks but kv_lazy_resident {req.kv_lazy_resident}"
                f" (kv_lazy {req.kv_lazy}, tracked {req in tracked})")


def _check_groups(kv, req) -> None:
    """Hybrid KV (sim.core.kv_groups): every group's table covers the computed tokens, keeps every block
    inside its window, holds its state blocks, and the live blocks are exactly `req_blocks`."""
    tables = kv.req_tables.get(req)
    _ensure(tables is not None and len(tables) == len(kv.groups), f"{req.request_id} lacks its group tables")
    for g, (group, table) in enumerate(zip(kv.groups, tables)):
        if group.state_blocks and getattr(kv, "checkpoint_tokens", 0):  # (Mamba align: positional states)
            _ensure(bool(table) and table[-1] is not None, f"{req.request_id} group {g} lost its running state")
            continue
        if group.state_blocks:
            live = [b for b in table if b is not None]
            _ensure(len(live) == group.state_blocks,
                    f"{req.request_id} group {g} holds {len(live)} state blocks, not {group.state_blocks}")
            continue
        needed = -(-req.num_computed_tokens // kv.block_size)
        _ensure(len(table) >= needed, f"{req.request_id} group {g} has {len(table)} blocks for "
                                      f"{req.num_computed_tokens} computed tokens")
        first = kv.first_needed_block(group, req.num_computed_tokens)
        if group.kind == CHUNKED:  # a hit may leave the head of its chunk out (vLLM: null blocks there)
            first = max(first, next((i for i, b in enumerate(table) if b is not None), first))
        _ensure(all(b is not None for b in table[first:needed]),
                f"{req.request_id} group {g} lost a block inside its window")
    live = [b for table in tables for b in table if b is not None]
    _ensure(sorted(live) == sorted(kv.req_blocks.get(req, ())), f"{req.request_id}: req_blocks out of date")


def check_budget(plan, config) -> None:
    """The step's plan respects the token budget and max_num_seqs."""
    total = sum(n for _, n in plan.scheduled)
    _ensure(total <= config.max_num_batched_tokens,
            f"step schedules {total} tokens, over max_num_batched_tokens={config.max_num_batched_tokens}")
    _ensure(len(plan.scheduled) <= config.max_num_seqs, "step schedules more than max_num_seqs requests")
    ids = [id(req) for req, _ in plan.scheduled]
    _ensure(len(ids) == len(set(ids)), "a request is scheduled twice in one step")
    for req, n in plan.scheduled:
        _ensure(n > 0 and not req.is_finished, f"{req.request_id}: bad schedule ({n} tokens, {req.status.name})")


def check_decode_rows(plan) -> None:
    """The plan's first `num_decodes` rows, before they advance, are one-token decodes that sample."""
    for req, n in plan.scheduled[:plan.num_decodes]:
        _ensure(n == 1 and req.num_computed_tokens + 1 >= req.num_prompt_tokens + len(req.output_token_ids)
                + req.num_output_placeholders, f"{req.request_id}: counted as a decode but does not sample")
