"""KV transfers that overlap share the link: max-min fair rates over senders' and receivers' ports."""
import simpy
from hypothesis import given, settings, strategies as st

from kernels_cost_model.links import Link
from sim.planning.transfer import LinkFabric, TransferLog

LINK = Link("test", bytes_per_s=1e9, latency_s=1e-3)


def _run(sends, source_ranks=(1, 1), destination_ranks=(1, 1), cancel=(), shared=True):
    """sends: (time, source, destination, bytes); cancel: (time, index). Returns the log's rows by index."""
    env, log = simpy.Environment(), TransferLog()
    fabric = LinkFabric(env, LINK, list(source_ranks), list(destination_ranks), log, shared=shared)
    flows, landed = {}, {}

    def at(when, action):
        yield env.timeout(when)
        action()

    for i, (when, src, dst, n) in enumerate(sends):
        def go(i=i, src=src, dst=dst, n=n):
            flows[i] = fabric.send(f"r{i}", src, dst, n, lambda now, i=i: landed.__setitem__(i, now))
        env.process(at(when, go))
    for when, i in cancel:
        env.process(at(when, lambda i=i: fabric.cancel(flows[i])))
    env.run()
    return landed, log.transfers().set_index("request_id")


def test_one_transfer_alone_takes_latency_plus_bytes_over_bandwidth():
    landed, rows = _run([(0.0, 0, 0, 10**9)])
    assert abs(landed[0] - (1e-3 + 1.0)) < 1e-12 and abs(rows.loc["r0", "alone_s"] - 1.001) < 1e-12


def test_two_overlapping_transfers_from_one_sender_take_longer_than_one():
    landed, _ = _run([(0.0, 0, 0, 10**9), (0.0, 0, 1, 10**9)])
    assert abs(landed[0] - 2.001) < 1e-9 and abs(landed[1] - 2.001) < 1e-9   # half the port each


def test_unshared_what_if_moves_each_transfer_as_if_alone():
    landed, _ = _run([(0.0, 0, 0, 10**9), (0.0, 0, 1, 10**9)], shared=False)
    assert abs(landed[0] - 1.001) < 1e-12 and abs(landed[1] - 1.001) < 1e-12


def test_two_senders_into_one_receiver_share_the_receiver():
    landed, _ = _run([(0.0, 0, 0, 10**9), (0.0, 1, 0, 10**9)])
    assert abs(landed[0] - 2.001) < 1e-9 and abs(landed[1] - 2.001) < 1e-9


def test_transfers_on_disjoint_ports_do_not_slow_each_other():
    landed, _ = _run([(0.0, 0, 0, 10**9), (0.0, 1, 1, 10**9)])
    assert abs(landed[0] - 1.001) < 1e-12 and abs(landed[1] - 1.001) < 1e-12


def test_a_share_one_transfer_cannot_use_goes_to_the_others():
    # sender 0 sends to receivers 0 and 1; sender 1 also sends to receiver 1: receiver 1 is split
    # between two, so sender 0's transfer to receiver 0 gets the rest of sender 0's port
    landed, _ = _run([(0.0, 0, 0, 10**9), (0.0, 0, 1, 10**9), (0.0, 1, 1, 10**9)],
                     source_ranks=(2, 1), destination_ranks=(1, 1))
    assert abs(landed[0] - 1.001) < 1e-9       # receiver 0 is its bottleneck: 1 GB/s
    assert abs(landed[1] - 2.001) < 1e-9 and abs(landed[2] - 2.001) < 1e-9


def test_a_cancelled_transfer_frees_its_share_at_once():
    landed, rows = _run([(0.0, 0, 0, 10**9), (0.0, 0, 1, 10**9)], cancel=[(0.501, 1)])
    assert 1 not in landed and list(rows.index) == ["r0"]
    # 0.5 s at half rate moved 0.25 GB; the remaining 0.75 GB at full rate
    assert abs(landed[0] - (0.501 + 0.75)) < 1e-9


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(0, 1), st.integers(0, 2), st.integers(1, 3 * 10**9)),
                min_size=1, max_size=8),
       st.tuples(st.integers(1, 4), st.integers(1, 4)), st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)))
def test_never_faster_than_the_ports_and_never_faster_than_alone(sends, source_ranks, destination_ranks):
    """Every transfer lands once, no sooner than alone; through any port, the bytes of the transfers
    moving within an interval never exceed its rate times that interval."""
    landed, rows = _run(sends, source_ranks, destination_ranks)
    assert len(landed) == len(sends) == len(rows)
    for i, (when, src, dst, n) in enumerate(sends):
        assert landed[i] - when >= rows.loc[f"r{i}", "alone_s"] * (1 - 1e-9)
    for column, ranks in (("source", source_ranks), ("destination", destination_ranks)):
        for port, group in rows.groupby(column):
            flowing = group.start + LINK.latency_s
            span = group.end.max() - flowing.min()
            assert group.num_bytes.sum() <= ranks[port] * LINK.bytes_per_s * (span * (1 + 1e-9) + 1e-12)  # float time


def test_identical_runs_give_identical_logs():
    sends = [(0.1 * i, i % 2, i % 3, 10**8 * (i + 1)) for i in range(6)]
    assert _run(sends, (1, 2), (1, 1, 2))[1].equals(_run(sends, (1, 2), (1, 1, 2))[1])
