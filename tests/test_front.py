"""Front clock (paper §2.1, §3.1.1, §3.3): monotonic global time, sequence numbers, reports."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flamestream.core.front import FrontClock, stamp_inputs
from flamestream.core.meta import GlobalTime


def test_stamp_sequence_within_and_across_milliseconds() -> None:
    c = FrontClock(3)
    assert c.stamp(5) == (GlobalTime(5, 3), (0,))
    assert c.stamp(5) == (GlobalTime(5, 3), (1,))
    assert c.stamp(5) == (GlobalTime(5, 3), (2,))
    assert c.stamp(9) == (GlobalTime(9, 3), (0,))
    assert c.stamp(10) == (GlobalTime(10, 3), (0,))


def test_clock_going_backwards_does_not_move_time_back() -> None:
    c = FrontClock(0)
    assert c.stamp(100) == (GlobalTime(100, 0), (0,))
    assert c.stamp(40) == (GlobalTime(100, 0), (1,))
    assert c.stamp(99) == (GlobalTime(100, 0), (2,))
    assert c.stamp(101) == (GlobalTime(101, 0), (0,))


def test_first_stamp_at_time_zero() -> None:
    assert FrontClock(1).stamp(0) == (GlobalTime(0, 1), (0,))


def test_report_is_a_promise_later_stamps_respect() -> None:
    c = FrontClock(2)
    assert c.report(50) == 50
    # The wall clock lags behind the promise: stamps are lifted to it.
    assert c.stamp(10) == (GlobalTime(50, 2), (0,))
    assert c.stamp(20) == (GlobalTime(50, 2), (1,))
    assert c.stamp(60) == (GlobalTime(60, 2), (0,))


def test_report_never_below_last_stamp_and_never_decreases() -> None:
    c = FrontClock(0)
    c.stamp(80)
    assert c.report(30) == 80  # last stamped timestamp already used
    assert c.stamp(30) == (GlobalTime(80, 0), (1,))
    assert c.report(90) == 90
    assert c.report(10) == 90
    assert c.stamp(85) == (GlobalTime(90, 0), (0,))


ops = st.lists(st.tuples(st.sampled_from(["stamp", "report", "report past"]), st.integers(0, 30)), max_size=60)


@given(ops)
def test_stamps_strictly_increase_and_keep_promises(sequence: list[tuple[str, int]]) -> None:
    c = FrontClock(7)
    last: tuple[int, int] | None = None
    promise = -1
    for op, now in sequence:
        if op == "report past":
            made = c.report_past_stamps(now, bound=25)
            if made is not None:
                assert made >= promise and made <= 25
                assert last is None or made > last[0], "it covers every stamp so far"
                promise = made
            continue
        if op == "report":
            p = c.report(now)
            assert p >= promise
            assert p >= now
            if last is not None:
                assert p >= last[0]
            promise = p
            continue
        gt, trace = c.stamp(now)
        assert gt.front == 7
        assert len(trace) == 1
        key = (gt.ts, trace[0])
        assert gt.ts >= now
        assert gt.ts >= promise
        if last is None:
            assert key == (max(now, promise), 0)
        else:
            assert key > last
            if gt.ts > last[0]:
                assert trace == (0,)
                assert gt.ts == max(now, promise)
            else:
                assert key == (last[0], last[1] + 1)
        last = key


def test_stamp_inputs_spreads_over_fronts_and_milliseconds() -> None:
    out = stamp_inputs(list("abcdefg"), fronts=2, per_ms=2)
    assert out == [
        (0, GlobalTime(0, 0), (0,), "a"),
        (1, GlobalTime(0, 1), (0,), "b"),
        (0, GlobalTime(0, 0), (1,), "c"),
        (1, GlobalTime(0, 1), (1,), "d"),
        (0, GlobalTime(1, 0), (0,), "e"),
        (1, GlobalTime(1, 1), (0,), "f"),
        (0, GlobalTime(1, 0), (1,), "g"),
    ]


def test_stamp_inputs_defaults_one_item_per_millisecond() -> None:
    assert stamp_inputs(["x", "y", "z"]) == [
        (0, GlobalTime(0, 0), (0,), "x"),
        (0, GlobalTime(1, 0), (0,), "y"),
        (0, GlobalTime(2, 0), (0,), "z"),
    ]
    assert stamp_inputs([]) == []


@given(st.integers(0, 60), st.integers(1, 4), st.integers(1, 4))
def test_stamp_inputs_metas_are_distinct_and_monotonic_per_front(n: int, fronts: int, per_ms: int) -> None:
    out = stamp_inputs(list(range(n)), fronts=fronts, per_ms=per_ms)
    assert [p for _, _, _, p in out] == list(range(n))
    metas = [(gt, trace) for _, gt, trace, _ in out]
    assert len(set(metas)) == n
    for f in range(fronts):
        mine = [(gt, trace) for front, gt, trace, _ in out if front == f]
        assert all(gt.front == f for gt, _ in mine)
        assert mine == sorted(mine)
    assert all(gt.ts == i // (fronts * per_ms) for i, (_, gt, _, _) in enumerate(out))


@pytest.mark.parametrize(("fronts", "per_ms"), [(0, 1), (1, 0), (-1, 2)])
def test_stamp_inputs_rejects_bad_arguments(fronts: int, per_ms: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        stamp_inputs(["a"], fronts=fronts, per_ms=per_ms)


def test_covered_once_a_promise_passes_everything_stamped() -> None:
    c = FrontClock(0)
    assert c.covered()  # nothing stamped yet
    c.report(10)
    assert c.covered()
    c.stamp(12)
    assert not c.covered()
    c.report(12)  # the same millisecond: items at 12 are not released by a promise of 12
    assert not c.covered()
    c.report(13)
    assert c.covered()


def test_a_report_past_the_stamps_covers_them_at_once_and_runs_the_clock_at_most_a_millisecond_ahead() -> None:
    c = FrontClock(0)
    c.stamp(12)
    assert c.report(12) == 12 and not c.covered()  # the clock's time does not pass a stamp of its millisecond
    assert c.report_past_stamps(12, bound=1000) == 13
    assert c.covered()
    assert c.stamp(12) == (GlobalTime(13, 0), (0,))  # a later stamp of millisecond 12 takes the next
    assert c.report_past_stamps(12, bound=1000) is None, "a promise of 14 at 12 would run the clock 2 ms ahead"
    assert not c.covered()
    assert c.report_past_stamps(13, bound=1000) == 14
    c.stamp(20)
    assert c.report_past_stamps(20, bound=20) is None, "never past the bound the front may promise"
    assert c.stamp(20) == (GlobalTime(20, 0), (1,)), "a refused promise leaves the clock as it was"
