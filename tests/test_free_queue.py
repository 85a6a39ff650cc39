"""The deque free queue (sim.core.free_queue) moves blocks exactly as an OrderedDict queue would."""
from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, strategies as st

from sim.core.free_queue import STALE_SLACK, FreeBlockQueue

NUM_BLOCKS = 24

# (move, argument): the argument picks a block or a count, modulo what is there to pick
MOVES = st.lists(st.tuples(st.sampled_from(["pop", "pop_many", "take_out", "take_out_many", "back", "front"]),
                           st.integers(0, 1000)), max_size=120)


def _reference_move(ref: OrderedDict, held: list, move: str, pick: int):
    """Apply `move` to the OrderedDict queue `ref` (and the blocks `held` out of it); returns what a
    pop returned, else None, and the blocks the move pushed or took out (to replay on the deque)."""
    if move == "pop" and ref:
        block, _ = ref.popitem(last=False)
        held.append(block)
        return [block]
    if move == "pop_many" and ref:
        count = pick % len(ref) + 1
        taken = [ref.popitem(last=False)[0] for _ in range(count)]
        held.extend(taken)
        return taken
    if move == "take_out" and ref:
        block = list(ref)[pick % len(ref)]
        del ref[block]
        held.append(block)
        return block
    if move == "take_out_many" and ref:
        free = list(ref)
        blocks = [free[(pick + 7 * i) % len(free)] for i in range(pick % len(free) + 1)]
        blocks = list(dict.fromkeys(blocks))  # distinct, as a prefix hit's blocks are
        for block in blocks:
            del ref[block]
        held.extend(blocks)
        return blocks
    if move in ("back", "front") and held:
        count = pick % len(held) + 1
        blocks = [held.pop(pick % len(held)) for _ in range(count)]
        if move == "back":
            for block in blocks:
                ref[block] = None
        else:  # the queue then starts with `blocks`, in order
            for block in reversed(blocks):
                ref[block] = None
                ref.move_to_end(block, last=False)
        return blocks
    return None


@given(MOVES)
def test_every_move_matches_an_ordered_dict(moves):
    ref = OrderedDict((b, None) for b in range(1, NUM_BLOCKS))
    queue, held = FreeBlockQueue(NUM_BLOCKS), []
    for move, pick in moves:
        outcome = _reference_move(ref, held, move, pick)
        if outcome is None:
            continue
        if move == "pop":
            assert [queue.pop_front()] == outcome
        elif move == "pop_many":
            assert queue.pop_front_many(len(outcome)) == outcome
        elif move == "take_out":
            queue.take_out(outcome)
        elif move == "take_out_many":
            queue.take_out_many(outcome)
        elif move == "back":
            queue.push_back(outcome)
        else:
            queue.push_front(outcome)
        assert list(queue) == list(ref) and len(queue) == len(ref)
        assert queue.num_stale == sum(queue.stale) == len(queue.entries) - len(queue)


def test_a_block_taken_out_and_put_back_is_found_at_its_new_place():
    queue = FreeBlockQueue(6)               # 1 2 3 4 5
    queue.take_out(2)                       # 1 3 4 5 (2's entry stale)
    queue.push_back([2])                    # 1 3 4 5 2
    assert list(queue) == [1, 3, 4, 5, 2] and queue.num_stale == 1
    assert queue.pop_front_many(3) == [1, 3, 4]
    assert queue.pop_front() == 5 and queue.pop_front() == 2 and not len(queue)


def test_front_pushes_of_a_block_with_a_stale_entry_drop_the_stale_entries():
    queue = FreeBlockQueue(5)               # 1 2 3 4
    queue.take_out(3)
    queue.push_front([3])                   # (never made by the manager: kept exact all the same)
    assert list(queue) == [3, 1, 2, 4] and queue.num_stale == 0


def test_stale_entries_are_dropped_once_they_pile_up():
    queue = FreeBlockQueue(3)
    for _ in range(STALE_SLACK + 2):
        queue.take_out(1)
        queue.push_back([1])
    assert queue.num_stale <= STALE_SLACK + 1 and len(queue.entries) <= STALE_SLACK + 3
    assert list(queue) == [2, 1]


def test_blocks_taken_out_together_leave_the_queue_as_one_by_one():
    one, many = FreeBlockQueue(STALE_SLACK + 40), FreeBlockQueue(STALE_SLACK + 40)
    blocks = list(range(5, STALE_SLACK + 30, 1))  # enough stale entries to rewrite the deque
    for block in blocks:
        one.take_out(block)
    many.take_out_many(blocks)
    assert list(one) == list(many) and len(one) == len(many)
    assert one.pop_front_many(len(one)) == many.pop_front_many(len(many))
