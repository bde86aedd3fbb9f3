"""Meta: global-time order, trace encoding, the invalidation relation (paper §3.1.1, §3.2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flamestream.core.meta import (
    CHILD_MASK,
    MAX_TIME,
    MIN_TIME,
    GlobalTime,
    LocalTime,
    Meta,
    decode,
    encode,
    invalidates,
    trace_invalidates,
)

G = GlobalTime(10, 1)


def lt(logical: int, child: int = 0) -> int:
    return LocalTime(logical, child).encode()


def meta(*local_times: tuple[int, int], gt: GlobalTime = G) -> Meta:
    return Meta(gt, encode([LocalTime(a, b) for a, b in local_times]))


# -- ordering -----------------------------------------------------------------------


def test_global_time_orders_by_timestamp_then_front() -> None:
    times = [GlobalTime(2, 0), GlobalTime(1, 5), GlobalTime(1, 0), GlobalTime(2, 3), GlobalTime(1, 2)]
    assert sorted(times) == [GlobalTime(1, 0), GlobalTime(1, 2), GlobalTime(1, 5), GlobalTime(2, 0), GlobalTime(2, 3)]
    # A later timestamp wins over any front id.
    assert GlobalTime(1, 1 << 30) < GlobalTime(2, 0)


def test_min_and_max_time_bound_real_times() -> None:
    for gt in (GlobalTime(0, 0), GlobalTime(-5, 0), GlobalTime(1 << 45, (1 << 31) - 1)):
        assert MIN_TIME < gt < MAX_TIME


def test_meta_orders_by_global_time_then_trace() -> None:
    a = Meta(GlobalTime(1, 0), (lt(9, 9),))
    b = Meta(GlobalTime(1, 1), (lt(0, 0),))
    c = Meta(GlobalTime(1, 1), (lt(0, 0), lt(0, 1)))
    d = Meta(GlobalTime(1, 1), (lt(0, 1),))
    e = Meta(GlobalTime(1, 1), (lt(1, 0),))
    assert sorted([e, d, c, b, a]) == [a, b, c, d, e]


# -- encoding -----------------------------------------------------------------------


def test_encode_layout() -> None:
    assert LocalTime(0, 0).encode() == 0
    assert LocalTime(0, 7).encode() == 7
    assert LocalTime(1, 0).encode() == 1 << 32
    assert LocalTime(3, 5).encode() == (3 << 32) + 5
    assert LocalTime(0, CHILD_MASK).encode() == (1 << 32) - 1


def test_encode_decode_round_trip_example() -> None:
    lts = (LocalTime(0, 3), LocalTime(7, 0), LocalTime(0, CHILD_MASK), LocalTime(1 << 40, 2))
    trace = encode(lts)
    assert trace == (3, 7 << 32, CHILD_MASK, ((1 << 40) << 32) | 2)
    assert decode(trace) == lts
    assert encode(list(lts)) == trace
    assert decode(()) == ()
    assert encode([]) == ()


@pytest.mark.parametrize("child", [-1, CHILD_MASK + 1, 1 << 40])
def test_encode_rejects_child_id_out_of_range(child: int) -> None:
    with pytest.raises(ValueError, match="child id"):
        LocalTime(0, child).encode()


# -- invalidation truth table --------------------------------------------------------

CASES = [
    # (newer, older, expected, why)
    (meta((0, 0), (2, 0)), meta((0, 0), (1, 0)), True, "higher logical time at first difference"),
    (meta((0, 0), (2, 0), (0, 0)), meta((0, 0), (1, 0), (0, 5)), True, "later differences do not matter"),
    (meta((0, 0), (2, 0)), meta((0, 0), (1, 3)), True, "logical time differs, child id too"),
    (meta((0, 0), (1, 0)), meta((0, 0), (2, 0)), False, "older has the higher logical time"),
    (meta((0, 0), (1, 0)), meta((0, 0), (1, 0)), False, "identical metas"),
    (meta((0, 1)), meta((0, 0)), False, "siblings: first difference is the child id"),
    (meta((0, 1), (1, 0)), meta((0, 0), (9, 0)), False, "siblings before a logical-time difference"),
    (meta((0, 0), (5, 1)), meta((0, 0), (5, 0)), False, "same logical time, child id differs"),
    (meta((0, 0), (1, 0)), meta((0, 0)), False, "older is a prefix (ancestor) of newer"),
    (meta((0, 0)), meta((0, 0), (1, 0)), False, "newer is a prefix of older"),
    (meta((0, 0), (2, 0), gt=GlobalTime(11, 1)), meta((0, 0), (1, 0)), False, "different global time"),
    (meta((0, 0), (2, 0), gt=GlobalTime(10, 2)), meta((0, 0), (1, 0)), False, "different front"),
    (meta(), meta(), False, "empty traces"),
]


@pytest.mark.parametrize(("newer", "older", "expected", "why"), CASES, ids=[c[3] for c in CASES])
def test_invalidation_truth_table(newer: Meta, older: Meta, expected: bool, why: str) -> None:
    assert invalidates(newer, older) is expected, why
    if newer.global_time == older.global_time:
        assert trace_invalidates(newer.trace, older.trace) is expected, why


# -- properties ---------------------------------------------------------------------

local_times = st.builds(
    LocalTime,
    logical_time=st.one_of(st.integers(0, 3), st.integers(0, 1 << 40)),
    child_id=st.one_of(st.integers(0, 3), st.integers(0, CHILD_MASK)),
)
lt_lists = st.lists(local_times, max_size=5)


@given(lt_lists)
def test_encode_decode_round_trip(lts: list[LocalTime]) -> None:
    assert decode(encode(lts)) == tuple(lts)


@given(lt_lists, lt_lists)
def test_encoded_order_matches_decoded_order(a: list[LocalTime], b: list[LocalTime]) -> None:
    pa = tuple((x.logical_time, x.child_id) for x in a)
    pb = tuple((x.logical_time, x.child_id) for x in b)
    ea, eb = encode(a), encode(b)
    assert (ea < eb) == (pa < pb)
    assert (ea == eb) == (pa == pb)
    assert (ea > eb) == (pa > pb)


# Small alphabets so that shared prefixes and collisions are common.
small_lts = st.builds(LocalTime, logical_time=st.integers(0, 2), child_id=st.integers(0, 2))
small_metas = st.builds(
    lambda ts, lts: Meta(GlobalTime(ts, 0), encode(lts)),
    st.integers(0, 1),
    st.lists(small_lts, max_size=4),
)


@given(small_metas)
def test_invalidates_is_irreflexive(m: Meta) -> None:
    assert not invalidates(m, m)


@given(small_metas, small_metas)
def test_invalidates_is_asymmetric(a: Meta, b: Meta) -> None:
    assert not (invalidates(a, b) and invalidates(b, a))


@given(small_metas, small_metas)
def test_invalidates_matches_definition(newer: Meta, older: Meta) -> None:
    """Paper §3.2 on decoded pairs: same global time, older < newer, first difference in logical time."""
    expected = False
    if newer.global_time == older.global_time:
        for a, b in zip(decode(older.trace), decode(newer.trace), strict=False):
            if a != b:
                expected = a < b and a.logical_time != b.logical_time
                break
    assert invalidates(newer, older) is expected
    if expected:
        assert older < newer


@given(small_metas, small_metas, small_metas)
def test_invalidates_is_transitive(a: Meta, b: Meta, c: Meta) -> None:
    if invalidates(a, b) and invalidates(b, c):
        assert invalidates(a, c)
