"""Hash-range layouts and ticks (paper §2.3, §4), plus the stable int32 hashing they cut."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flamestream.core.hashing import INT32_MAX, INT32_MIN, constant_hash, stable_hash, to_int32
from flamestream.core.meta import GlobalTime
from flamestream.core.tick import Layout, Tick

int32s = st.integers(INT32_MIN, INT32_MAX)


def test_single_worker_owns_everything() -> None:
    layout = Layout.even(1)
    assert layout.starts == (INT32_MIN,)
    assert layout.workers == 1
    assert layout.range_of(0) == (INT32_MIN, INT32_MAX)
    for h in (INT32_MIN, -1, 0, 1, INT32_MAX):
        assert layout.owner(h) == 0


def test_even_two_and_four() -> None:
    assert Layout.even(2).starts == (INT32_MIN, 0)
    four = Layout.even(4)
    assert four.starts == (INT32_MIN, -(1 << 30), 0, 1 << 30)
    assert [four.range_of(i) for i in range(4)] == [
        (INT32_MIN, -(1 << 30) - 1),
        (-(1 << 30), -1),
        (0, (1 << 30) - 1),
        (1 << 30, INT32_MAX),
    ]
    probes = (INT32_MIN, -(1 << 30) - 1, -(1 << 30), -1, 0, (1 << 30) - 1, 1 << 30)
    assert [four.owner(h) for h in probes] == [0, 0, 1, 1, 2, 2, 3]
    assert four.owner(INT32_MAX) == 3


def test_even_three_has_uneven_last_range() -> None:
    three = Layout.even(3)
    assert three.starts == (-2147483648, -715827883, 715827882)
    assert three.range_of(2) == (715827882, INT32_MAX)


@given(st.integers(1, 200))
def test_even_ranges_are_contiguous_and_cover_int32(n: int) -> None:
    layout = Layout.even(n)
    assert layout.workers == n
    ranges = [layout.range_of(i) for i in range(n)]
    assert ranges[0][0] == INT32_MIN
    assert ranges[-1][1] == INT32_MAX
    for (_, hi), (lo, _) in itertools.pairwise(ranges):
        assert lo == hi + 1
    sizes = [hi - lo + 1 for lo, hi in ranges]
    assert sum(sizes) == 1 << 32
    assert max(sizes) - min(sizes) < n  # even up to the remainder


@given(st.integers(1, 200), int32s)
def test_owner_is_the_range_index(n: int, h: int) -> None:
    layout = Layout.even(n)
    i = layout.owner(h)
    assert 0 <= i < n
    lo, hi = layout.range_of(i)
    assert lo <= h <= hi


@pytest.mark.parametrize("n", [0, -3])
def test_even_needs_a_worker(n: int) -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        Layout.even(n)


@pytest.mark.parametrize(
    "starts",
    [(), (0,), (INT32_MIN + 1,), (INT32_MIN, 5, 5), (INT32_MIN, 10, 3)],
)
def test_layout_rejects_bad_starts(starts: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Layout(starts)


def test_custom_layout() -> None:
    layout = Layout((INT32_MIN, -10, 10))
    assert layout.owner(-11) == 0
    assert layout.owner(-10) == 1
    assert layout.owner(9) == 1
    assert layout.owner(10) == 2
    assert layout.range_of(1) == (-10, 9)


def test_tick_is_frozen_plain_data() -> None:
    tick = Tick(1, GlobalTime(0, 0), {"name": "g"}, Layout.even(2))
    assert tick.layout.workers == 2
    assert tick == Tick(1, GlobalTime(0, 0), {"name": "g"}, Layout.even(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        tick.number = 2  # type: ignore[misc]


def test_to_int32_folds() -> None:
    assert to_int32(0) == 0
    assert to_int32(INT32_MAX) == INT32_MAX
    assert to_int32(INT32_MAX + 1) == INT32_MIN
    assert to_int32(0xFFFFFFFF) == -1
    assert to_int32(-1) == -1
    assert to_int32(1 << 32) == 0
    assert to_int32((1 << 40) + 5) == 5


@given(st.integers(-(1 << 70), 1 << 70))
def test_to_int32_is_congruent_and_in_range(v: int) -> None:
    r = to_int32(v)
    assert INT32_MIN <= r <= INT32_MAX
    assert (r - v) % (1 << 32) == 0


def test_stable_hash_known_values() -> None:
    # crc32(b"a") == 0xE8B7BE43, folded into int32
    assert stable_hash("a") == 0xE8B7BE43 - (1 << 32) == -390611389
    assert stable_hash(b"a") == stable_hash("a")
    assert stable_hash(7) == 1790921346  # crc32(b"7"): repr of non-strings
    assert stable_hash(7) == stable_hash("7")
    assert constant_hash("anything") == 0


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 1000), min_size=8, max_size=64), workers=st.integers(1, 8))
@example(loads=[0, 0, 0, 0, 1, 0, 0, 0], workers=4)  # cut 3 pushed past cut 2 (found by CI)
def test_balanced_layouts_split_the_measured_load_at_bucket_borders(loads: list[int], workers: int) -> None:
    layout = Layout.balanced(loads, workers)
    assert layout.workers == workers  # valid: starts at INT32_MIN, strictly increasing (checked by Layout)
    width = (INT32_MAX - INT32_MIN + 1) // len(loads)
    if sum(loads) == 0 or workers > len(loads):
        assert layout == Layout.even(workers)
        return
    assert all((start - INT32_MIN) % width == 0 for start in layout.starts)
    shares = [sum(load for b, load in enumerate(loads) if layout.owner(INT32_MIN + b * width) == w)
              for w in range(workers)]
    assert sum(shares) == sum(loads)
    # Each cut is within one bucket of its equal share, unless it was pushed: past the previous cut (every worker
    # gets a bucket) or before the buckets that must be left for the workers after it.
    borders = [(start - INT32_MIN) // width for start in layout.starts]
    for k in range(1, workers):
        border = borders[k]
        if borders[k - 1] + 1 < border < len(loads) - (workers - k):
            target = sum(loads) * k / workers
            assert abs(sum(loads[:border]) - target) <= max(loads[border - 1], loads[border]), (k, border)


def test_a_hot_key_gets_a_worker_of_its_own() -> None:
    loads = [1] * 256
    loads[10] = 1000
    layout = Layout.balanced(loads, 3)
    hot = INT32_MIN + 10 * (1 << 24)
    owner = layout.owner(hot)
    assert layout.range_of(owner) == (hot, hot + (1 << 24) - 1)  # nothing else shares the hot bucket's worker
    assert Layout.balanced([0] * 256, 3) == Layout.even(3)


weights_lists = st.lists(st.floats(0.01, 100.0), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(weights=weights_lists)
@example(weights=[0.5, 1.0])  # a worker beside the front, the acker and the barrier, and one alone
@example(weights=[0.01] + [100.0] * 7)
@example(weights=[1.0] * 6)  # equal weights give ``even``: 2**32 % 6 == 4 hashes left over, on the last worker
def test_weighted_layouts_give_each_worker_its_share_of_the_hash_space(weights: list[float]) -> None:
    layout = Layout.weighted(weights)  # valid: starts at INT32_MIN, strictly increasing (checked by Layout)
    assert layout.workers == len(weights)
    space = INT32_MAX - INT32_MIN + 1
    for i, weight in enumerate(weights):
        lo, hi = layout.range_of(i)
        # within two hashes of the share, or (equal weights: ``even``) the division's remainder, < workers
        assert abs((hi - lo + 1) - space * weight / sum(weights)) <= max(2, len(weights)), (i, weights)


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8])
def test_equal_weights_are_the_even_layout(workers: int) -> None:
    assert Layout.weighted([0.7] * workers) == Layout.even(workers)
    assert Layout.balanced([], workers, [1.0] * workers) == Layout.even(workers)


def test_half_the_weight_is_a_third_of_two_workers() -> None:
    layout = Layout.weighted([0.5, 1.0])
    assert layout.starts == (INT32_MIN, INT32_MIN + (1 << 32) // 3)
    assert Layout.balanced([0] * 256, 2, [0.5, 1.0]) == layout  # nothing measured: the weights alone


@pytest.mark.parametrize("bad", [0.0, -1.0, 0.001, 1000.0, float("nan"), float("inf"), True, "1", None])
def test_weights_out_of_range_or_not_numbers_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="a worker's weight must be"):
        Layout.weighted([1.0, bad])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="a worker's weight must be"):
        Layout.balanced([1] * 8, 2, [1.0, bad])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 weights for 3 workers"):
        Layout.balanced([1] * 8, 3, [1.0, 1.0])


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 1000), min_size=8, max_size=64), weights=weights_lists)
def test_weighted_balanced_layouts_split_the_load_in_proportion(loads: list[int], weights: list[float]) -> None:
    workers = len(weights)
    layout = Layout.balanced(loads, workers, weights)
    assert layout.workers == workers
    if sum(loads) == 0 or workers > len(loads):
        assert layout == Layout.weighted(weights)
        return
    width = (INT32_MAX - INT32_MIN + 1) // len(loads)
    borders = [(start - INT32_MIN) // width for start in layout.starts]
    assert all((start - INT32_MIN) % width == 0 for start in layout.starts)
    for k in range(1, workers):  # within a bucket of its weighted target, unless pushed (as unweighted)
        border = borders[k]
        if borders[k - 1] + 1 < border < len(loads) - (workers - k):
            target = sum(loads) * sum(weights[:k]) / sum(weights)
            assert abs(sum(loads[:border]) - target) <= max(loads[border - 1], loads[border]) + 1e-6, (k, border)
