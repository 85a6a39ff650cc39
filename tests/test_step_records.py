"""Step records: narrow integer columns that widen when a value does not fit, with every value kept."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sim.core.records import StepRecords

INTS = (st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-(1 << 32), 1 << 32) | st.integers(-40_000, 40_000)
        | st.integers(-200, 300))


def _row(draw_ints, t):
    return (t, t / 2, *draw_ints)


@given(st.lists(st.tuples(st.booleans(), st.lists(st.lists(INTS, min_size=10, max_size=10), min_size=1,
                                                    max_size=5)), max_size=8))
def test_rows_read_back_as_added_whatever_their_size(batches):
    records, expected = StepRecords(), []
    for one_by_one, rows in batches:
        rows = [(float(len(expected) + i), 0.5, *ints) for i, ints in enumerate(rows)]
        if one_by_one:
            for row in rows:
                records.append_row(row)
        else:
            records.extend_rows(list(zip(*rows)))
        expected.extend(rows)
    assert len(records) == len(expected)
    columns = list(records.columns().values())
    assert [tuple(column[i] for column in columns) for i in range(len(expected))] == expected


def test_small_counts_take_one_byte_and_a_large_one_widens_its_column_only():
    records = StepRecords()
    records.append_row((0.0, 1.0) + (5,) * 10)
    assert records.kv_blocks_used.itemsize == 1
    records.append_row((1.0, 1.0) + (5,) * 5 + (70_000,) + (5,) * 4)
    assert records.kv_blocks_used.itemsize == 4 and records.kv_blocks_cached.itemsize == 1
    assert list(records.kv_blocks_used) == [5, 70_000] and list(records.num_preempted) == [5, 5]
