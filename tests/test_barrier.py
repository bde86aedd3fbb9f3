"""Barrier invalidation buffer (paper §3.2 Algorithm 2, §3.3): invalidation, tombstones, release."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flamestream.core.barrier import ArrivalBuffer, BarrierBuffer
from flamestream.core.meta import CHILD_BITS, MAX_TIME, GlobalTime, Meta, Trace, invalidates

G1 = GlobalTime(1, 0)
G2 = GlobalTime(1, 1)
G3 = GlobalTime(2, 0)


def mark(logical: int) -> int:
    """A grouping's local time: logical time ``logical``, child 0."""
    return logical << CHILD_BITS


def put(buf: BarrierBuffer, payload: Any, gt: GlobalTime, trace: Trace, tombstone: bool = False) -> None:
    buf.insert((payload, gt, trace, tombstone))


def drain(buf: BarrierBuffer) -> list[tuple[GlobalTime, Trace, Any]]:
    return buf.release(MAX_TIME)


# -- invalidation ---------------------------------------------------------------------


def test_newcomer_drops_the_item_it_invalidates() -> None:
    buf = BarrierBuffer()
    put(buf, "stale", G1, (0, mark(1)))
    put(buf, "fresh", G1, (0, mark(2)))
    assert len(buf) == 1
    assert drain(buf) == [(G1, (0, mark(2)), "fresh")]


def test_newcomer_invalidated_by_present_item_is_dropped() -> None:
    buf = BarrierBuffer()
    put(buf, "fresh", G1, (0, mark(2)))
    put(buf, "stale", G1, (0, mark(1)))
    assert len(buf) == 1
    assert drain(buf) == [(G1, (0, mark(2)), "fresh")]


def test_three_versions_any_order_keep_the_newest() -> None:
    for order in ([1, 3, 2], [2, 1, 3], [3, 2, 1], [2, 3, 1]):
        buf = BarrierBuffer()
        for v in order:
            put(buf, f"v{v}", G1, (4, mark(v), 0))
        assert drain(buf) == [(G1, (4, mark(3), 0), "v3")], order


def test_invalidation_at_an_ancestor_position_drops_descendants() -> None:
    """A replayed grouping output invalidates everything derived from its stale version."""
    buf = BarrierBuffer()
    stale_a = (0, mark(1), 0, mark(7))
    stale_b = (0, mark(1), 1)
    put(buf, "a", G1, stale_a)
    put(buf, "b", G1, stale_b)
    fresh = (0, mark(2), 0)
    put(buf, "c", G1, fresh)
    assert drain(buf) == [(G1, fresh, "c")]
    # ... and in the other arrival order, the stale descendants are refused.
    buf = BarrierBuffer()
    put(buf, "c", G1, fresh)
    put(buf, "a", G1, stale_a)
    put(buf, "b", G1, stale_b)
    assert drain(buf) == [(G1, fresh, "c")]


def test_siblings_do_not_invalidate() -> None:
    buf = BarrierBuffer()
    put(buf, "x", G1, (0, mark(1), 1))
    put(buf, "y", G1, (0, mark(1), 0))
    put(buf, "z", G1, (1, mark(9)))  # sibling at the front: different input item
    put(buf, "w", G1, (0, mark(1), 2, mark(1)))
    assert drain(buf) == [
        (G1, (0, mark(1), 0), "y"),
        (G1, (0, mark(1), 1), "x"),
        (G1, (0, mark(1), 2, mark(1)), "w"),
        (G1, (1, mark(9)), "z"),
    ]


def test_ancestor_and_descendant_both_kept() -> None:
    buf = BarrierBuffer()
    put(buf, "long", G1, (0, mark(1), 0))
    put(buf, "short", G1, (0, mark(1)))
    assert drain(buf) == [(G1, (0, mark(1)), "short"), (G1, (0, mark(1), 0), "long")]


def test_different_global_times_never_invalidate() -> None:
    buf = BarrierBuffer()
    put(buf, "a", G2, (0, mark(1)))
    put(buf, "b", G1, (0, mark(2)))
    put(buf, "c", G3, (0, mark(1)))
    assert drain(buf) == [(G1, (0, mark(2)), "b"), (G2, (0, mark(1)), "a"), (G3, (0, mark(1)), "c")]


# -- tombstones ---------------------------------------------------------------------


def test_tombstone_after_item_cancels_it() -> None:
    buf = BarrierBuffer()
    put(buf, "a", G1, (0, mark(1)))
    put(buf, "b", G1, (1, mark(1)))
    put(buf, "a", G1, (0, mark(1)), tombstone=True)
    assert len(buf) == 1
    assert drain(buf) == [(G1, (1, mark(1)), "b")]
    assert buf.received == 2
    assert buf.retractions == 1


def test_tombstone_before_item_cancels_it() -> None:
    buf = BarrierBuffer()
    put(buf, "a", G1, (0, mark(1)), tombstone=True)
    put(buf, "a", G1, (0, mark(1)))
    put(buf, "b", G1, (0, mark(1), 0))  # a descendant's trace is not cancelled
    assert drain(buf) == [(G1, (0, mark(1), 0), "b")]


def test_tombstone_only_cancels_exact_meta() -> None:
    buf = BarrierBuffer()
    put(buf, "a", G1, (0, mark(1)), tombstone=True)
    put(buf, "a", G2, (0, mark(1)), tombstone=True)  # other global time
    put(buf, "a", G1, (0, mark(1), 0), tombstone=True)  # longer trace
    put(buf, "a", G1, (0, mark(1)))
    put(buf, "a", G2, (1, mark(1)))
    put(buf, "a", G1, (1,))
    assert drain(buf) == [(G1, (1,), "a"), (G2, (1, mark(1)), "a")]


def test_retracted_then_replaced() -> None:
    """The grouping's replay sequence: v1, tomb(v1), v2 in the order it was emitted."""
    buf = BarrierBuffer()
    put(buf, "w1", G1, (0, mark(1)))
    put(buf, "w1", G1, (0, mark(1)), tombstone=True)
    put(buf, "w2", G1, (0, mark(2)))
    assert drain(buf) == [(G1, (0, mark(2)), "w2")]


def test_same_trace_twice_raises() -> None:
    buf = BarrierBuffer()
    put(buf, "a", G1, (0, mark(1)))
    with pytest.raises(ValueError, match="twice"):
        put(buf, "a", G1, (0, mark(1)))


# -- release ------------------------------------------------------------------------


def test_release_only_below_min_time_in_meta_order() -> None:
    buf = BarrierBuffer()
    put(buf, "g3", G3, (0,))
    put(buf, "g2b", G2, (1,))
    put(buf, "g1", G1, (0, 5))
    put(buf, "g2a", G2, (0, mark(1)))
    put(buf, "g1b", G1, (0, 2))
    assert buf.release(G1) == []  # strictly below
    assert buf.release(G2) == [(G1, (0, 2), "g1b"), (G1, (0, 5), "g1")]
    assert buf.release(G2) == []
    assert len(buf) == 3
    assert buf.release(GlobalTime(2, 0)) == [(G2, (0, mark(1)), "g2a"), (G2, (1,), "g2b")]
    assert buf.release(GlobalTime(2, 1)) == [(G3, (0,), "g3")]
    assert len(buf) == 0
    assert buf.release(MAX_TIME) == []


def test_release_of_empty_buffer() -> None:
    assert BarrierBuffer().release(MAX_TIME) == []


# -- property: against a naive reference ---------------------------------------------


class NaiveBarrier:
    """Algorithm 2 over a plain list, plus tombstones cancelling in either order."""

    def __init__(self) -> None:
        self.items: list[tuple[Meta, Any]] = []
        self.tombstones: set[Meta] = set()

    def insert(self, payload: Any, gt: GlobalTime, trace: Trace, tombstone: bool) -> None:
        m = Meta(gt, trace)
        if tombstone:
            for i, (other, _) in enumerate(self.items):
                if other == m:
                    del self.items[i]
                    return
            self.tombstones.add(m)
            return
        if m in self.tombstones:
            self.tombstones.discard(m)
            return
        if any(invalidates(other, m) for other, _ in self.items):
            return
        self.items = [(o, p) for o, p in self.items if not invalidates(m, o)]
        self.items.append((m, payload))

    def release(self, min_time: GlobalTime) -> list[tuple[GlobalTime, Trace, Any]]:
        out = sorted((m.global_time, m.trace, p) for m, p in self.items if m.global_time < min_time)
        self.items = [(m, p) for m, p in self.items if m.global_time >= min_time]
        return out


TIMES = (GlobalTime(0, 0), GlobalTime(0, 1), GlobalTime(1, 0))


def make_trace(seed: int, choices: list[int]) -> Trace:
    """A realistic path: position 0 is the front (sequence number), then each operation is
    either stateless (logical time 0, child id = which output) or a grouping (a mark with
    logical time >= 1, child 0).  The operation after a given prefix is a fixed function of
    that prefix, as it is in a real graph (the same item always goes to the same operation)."""
    trace: list[int] = []
    for depth, c in enumerate(choices):
        if depth == 0:
            trace.append(c % 2)
        elif random.Random(f"{seed}/{tuple(trace)}").random() < 0.5:
            trace.append(mark(c % 3 + 1))
        else:
            trace.append(c % 3)
    return tuple(trace)


item_specs = st.lists(
    st.tuples(st.integers(0, len(TIMES) - 1), st.lists(st.integers(0, 2), min_size=1, max_size=4), st.booleans()),
    max_size=30,
)


def build_events(
    seed: int, specs: list[tuple[int, list[int], bool]], order_seed: int, tombstones: bool
) -> list[tuple[Any, GlobalTime, Trace, bool]]:
    items: dict[Meta, bool] = {}
    for t, choices, tomb in specs:
        items.setdefault(Meta(TIMES[t], make_trace(seed, choices)), tomb and tombstones)
    if tombstones:
        # The retraction discipline of groupings: whatever a retracted item invalidates
        # was itself retracted earlier (every replaced version gets its own tombstone).
        changed = True
        while changed:
            changed = False
            for m, tomb in items.items():
                if not tomb and any(t and invalidates(o, m) for o, t in items.items()):
                    items[m] = changed = True
    events = []
    for m, tomb in items.items():
        payload = f"p{m.global_time.ts}.{m.global_time.front}.{m.trace}"
        events.append((payload, m.global_time, m.trace, False))
        if tomb:
            events.append((payload, m.global_time, m.trace, True))
    random.Random(order_seed).shuffle(events)
    return events


def check_against_naive(events: list[tuple[Any, GlobalTime, Trace, bool]], split: int) -> None:
    buf, ref = BarrierBuffer(), NaiveBarrier()
    for payload, gt, trace, tomb in events:
        buf.insert((payload, gt, trace, tomb))
        ref.insert(payload, gt, trace, tomb)
    cut = TIMES[split]
    first = buf.release(cut)
    assert first == ref.release(cut)
    assert all(gt < cut for gt, _, _ in first)
    assert buf.release(MAX_TIME) == ref.release(MAX_TIME)
    assert len(buf) == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**16), item_specs, st.integers(0, 2**32), st.integers(0, len(TIMES) - 1))
def test_matches_naive_reference_pure_invalidation(
    seed: int, specs: list[tuple[int, list[int], bool]], order_seed: int, split: int
) -> None:
    check_against_naive(build_events(seed, specs, order_seed, tombstones=False), split)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**16), item_specs, st.integers(0, 2**32), st.integers(0, len(TIMES) - 1))
def test_matches_naive_reference_with_tombstones(
    seed: int, specs: list[tuple[int, list[int], bool]], order_seed: int, split: int
) -> None:
    check_against_naive(build_events(seed, specs, order_seed, tombstones=True), split)


def test_generator_reaches_invalidating_pairs() -> None:
    """The trace generator must actually create invalidation, or the property tests are vacuous."""
    rng = random.Random(0)
    hits = 0
    for _ in range(200):
        specs = [(rng.randrange(3), [rng.randrange(3) for _ in range(rng.randint(1, 4))], False) for _ in range(15)]
        events = build_events(rng.randrange(2**16), specs, 0, tombstones=False)
        metas = [Meta(gt, tr) for _, gt, tr, _ in events]
        hits += any(invalidates(a, b) for a in metas for b in metas)
    assert hits > 100


def test_version_below_a_retracted_higher_version_is_still_stale() -> None:
    """A grouping retracts every version it replaces, so a version below the highest one ever seen at a
    prefix is stale even after that higher version is itself retracted (its element left the bucket)."""
    buf = BarrierBuffer()
    put(buf, "new", G1, (0, mark(2)))
    put(buf, "new", G1, (0, mark(2)), tombstone=True)
    put(buf, "old", G1, (0, mark(1)))
    assert drain(buf) == []


def test_arrival_buffer_releases_everything_at_once_and_drops_tombstones() -> None:
    """Guarantees off: no min time, no invalidation — a stale version is released too."""
    buffer = ArrivalBuffer()
    gt = GlobalTime(5, 0)
    buffer.insert(("old", gt, (0, 1 << 32), False))
    buffer.insert(("new", gt, (0, 2 << 32), False))
    buffer.insert(("old", gt, (0, 1 << 32), True))
    assert buffer.release(None) == [(gt, (0, 1 << 32), "old"), (gt, (0, 2 << 32), "new")]
    assert (buffer.received, buffer.retractions, len(buffer)) == (2, 1, 0)


def test_barrier_buffer_releases_nothing_before_a_min_time_is_known() -> None:
    buffer = BarrierBuffer()
    buffer.insert(("x", GlobalTime(1, 0), (0,), False))
    assert buffer.release(None) == []
    assert len(buffer.release(GlobalTime(2, 0))) == 1
