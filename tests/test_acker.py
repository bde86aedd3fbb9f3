"""Ack table (paper §3.3): XOR bookkeeping, fronts' reports, minimal time."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flamestream.core.acker import AckTable
from flamestream.core.meta import GlobalTime


def test_needs_a_front() -> None:
    with pytest.raises(ValueError, match="at least one front"):
        AckTable([])


def test_initial_min_time_is_least_start_promise() -> None:
    assert AckTable([3, 1, 2]).min_time() == GlobalTime(0, 1)
    assert AckTable([0], start_ts=7).min_time() == GlobalTime(7, 0)


def test_send_and_receive_cancel() -> None:
    t = AckTable([0])
    t.report(0, 100)
    gt = GlobalTime(5, 0)
    t.ack(gt, 0xDEADBEEF)
    assert t.in_flight() == 1
    assert t.min_time() == gt
    t.ack(gt, 0xDEADBEEF)
    assert t.in_flight() == 0
    assert t.min_time() == GlobalTime(100, 0)


def test_entry_stays_nonzero_between_hops() -> None:
    """send(a); send(b) + receive(a) combined; receive(b): zero only at the end."""
    t = AckTable([0])
    t.report(0, 100)
    gt = GlobalTime(5, 0)
    a, b = 0x1111, 0x2222
    t.ack(gt, a)
    assert t.min_time() == gt
    t.ack(gt, b ^ a)
    assert t.min_time() == gt
    t.ack(gt, b)
    assert t.min_time() == GlobalTime(100, 0)


def test_zero_xor_does_not_create_entry() -> None:
    t = AckTable([0])
    t.report(0, 100)
    t.ack(GlobalTime(5, 0), 0)
    assert t.in_flight() == 0
    assert t.min_time() == GlobalTime(100, 0)


def test_min_time_is_smallest_nonzero_global_time() -> None:
    t = AckTable([0, 1])
    t.report(0, 100)
    t.report(1, 100)
    t.ack(GlobalTime(30, 1), 1)
    t.ack(GlobalTime(20, 1), 2)
    t.ack(GlobalTime(20, 0), 3)
    t.ack(GlobalTime(40, 0), 4)
    assert t.min_time() == GlobalTime(20, 0)
    t.ack(GlobalTime(20, 0), 3)
    assert t.min_time() == GlobalTime(20, 1)
    t.ack(GlobalTime(30, 1), 1)  # clearing a non-minimal entry does not move the minimum
    assert t.min_time() == GlobalTime(20, 1)
    t.ack(GlobalTime(20, 1), 2)
    assert t.min_time() == GlobalTime(40, 0)
    t.ack(GlobalTime(40, 0), 4)
    assert t.min_time() == GlobalTime(100, 0)
    assert t.in_flight() == 0


def test_min_time_capped_by_least_report() -> None:
    t = AckTable([0, 1, 2])
    t.ack(GlobalTime(50, 0), 9)
    assert t.min_time() == GlobalTime(0, 0)
    t.report(0, 60)
    assert t.min_time() == GlobalTime(0, 1)
    t.report(1, 40)
    t.report(2, 45)
    assert t.min_time() == GlobalTime(40, 1)
    t.report(1, 70)
    assert t.min_time() == GlobalTime(45, 2)
    t.report(2, 80)
    assert t.min_time() == GlobalTime(50, 0)  # now the in-flight entry is the minimum
    t.ack(GlobalTime(50, 0), 9)
    assert t.min_time() == GlobalTime(60, 0)


def test_cap_ties_broken_by_front_id() -> None:
    t = AckTable([0, 1])
    t.report(0, 10)
    t.report(1, 10)
    assert t.min_time() == GlobalTime(10, 0)
    t.ack(GlobalTime(10, 0), 1)  # (10, 0) in flight equals the cap
    assert t.min_time() == GlobalTime(10, 0)


def test_readding_a_cleared_global_time() -> None:
    t = AckTable([0])
    t.report(0, 100)
    gt, later = GlobalTime(5, 0), GlobalTime(8, 0)
    t.ack(later, 7)
    t.ack(gt, 1)
    t.ack(gt, 1)
    assert t.min_time() == later
    t.ack(gt, 2)  # same global time is in flight again
    assert t.min_time() == gt
    assert t.in_flight() == 2
    t.ack(gt, 2)
    assert t.min_time() == later
    t.ack(gt, 3)  # and again: a stale heap entry must not hide it or resurrect it
    assert t.min_time() == gt
    t.ack(gt, 3)
    t.ack(later, 7)
    assert t.min_time() == GlobalTime(100, 0)
    assert t.in_flight() == 0


def test_report_regression_ignored() -> None:
    t = AckTable([0, 1])
    t.report(1, 1000)
    t.report(0, 50)
    assert t.min_time() == GlobalTime(50, 0)
    t.report(0, 20)
    assert t.min_time() == GlobalTime(50, 0)
    t.report(0, 50)
    assert t.min_time() == GlobalTime(50, 0)


def test_unknown_front_rejected() -> None:
    t = AckTable([0, 1])
    with pytest.raises(ValueError, match="unknown front 2"):
        t.report(2, 10)
    assert t.min_time() == GlobalTime(0, 0)


# -- property: random interleavings vs a naive recomputation -------------------------

FRONTS = (0, 1, 2)


def naive_min_time(acks: list[tuple[GlobalTime, int]], reports: dict[int, int]) -> GlobalTime:
    xor: dict[GlobalTime, int] = {}
    for gt, x in acks:
        xor[gt] = xor.get(gt, 0) ^ x
    candidates = [gt for gt, v in xor.items() if v]
    candidates += [GlobalTime(ts, f) for f, ts in reports.items()]
    return min(candidates)


@given(
    pairs=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from(FRONTS), st.integers(1, (1 << 64) - 1)),
        max_size=25,
    ),
    reports=st.lists(st.tuples(st.sampled_from(FRONTS), st.integers(0, 8)), max_size=10),
    seed=st.integers(0, 2**32),
)
def test_min_time_matches_naive_recomputation(
    pairs: list[tuple[int, int, int]], reports: list[tuple[int, int]], seed: int
) -> None:
    """Every item is acked once on send and once on receive, in any interleaving."""
    events: list[tuple[str, object]] = []
    for ts, front, x in pairs:
        ack = (GlobalTime(ts, front), x)
        events += [("ack", ack), ("ack", ack)]
    events += [("report", r) for r in reports]
    random.Random(seed).shuffle(events)

    table = AckTable(FRONTS)
    done: list[tuple[GlobalTime, int]] = []
    promised = dict.fromkeys(FRONTS, 0)
    for kind, value in events:
        if kind == "ack":
            gt, x = value  # type: ignore[misc]
            table.ack(gt, x)
            done.append((gt, x))
        else:
            front, ts = value  # type: ignore[misc]
            table.report(front, ts)
            promised[front] = max(promised[front], ts)
        assert table.min_time() == naive_min_time(done, promised)
    assert table.in_flight() == 0
    assert table.min_time() == min(GlobalTime(ts, f) for f, ts in promised.items())


def test_a_new_min_time_is_worth_publishing_only_once_something_completed_at_or_above_the_last() -> None:
    t = AckTable([0])
    first = t.min_time()
    assert t.worth_publishing(None, first)
    t.report(0, 10)  # an idle front's report: nothing held anywhere can be released by it
    assert not t.worth_publishing(first, t.min_time())
    gt = GlobalTime(12, 0)
    t.ack(gt, 0xF00D)
    t.report(0, 20)
    assert t.min_time() == gt and not t.worth_publishing(first, gt)  # still in flight
    t.ack(gt, 0xF00D)
    assert t.min_time() == GlobalTime(20, 0) and t.worth_publishing(first, t.min_time())
    t.report(0, 30)
    assert not t.worth_publishing(GlobalTime(20, 0), t.min_time())  # 12 was released by 20 already
    assert t.worth_publishing(GlobalTime(12, 0), t.min_time())  # ...but not by 12
    assert not t.worth_publishing(GlobalTime(30, 0), GlobalTime(30, 0))  # never an old or equal value
